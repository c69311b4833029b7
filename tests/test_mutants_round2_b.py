"""Issue 27, round 2 of mutmut (groups sweep, tables, ruler_eval, runs, ruler): the behaviours the surviving mutants
showed untested. Each test pins values a one-line bug of the mutant's shape would change."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

# ---------------------------------------------------------------------------------------------------------------
# sweep


def _lm_shipping(rope_type):
    from ctxeval.rope.geometry import RopeInfo

    return SimpleNamespace(rope=RopeInfo(None, {"rope_type": rope_type} if rope_type else {}))


@pytest.mark.parametrize(
    "shipped, expected", [("dynamic", True), ("longrope", True), ("yarn", False), ("default", False), (None, False)]
)
def test_native_is_length_dependent_exactly_when_the_checkpoint_ships_a_dynamic_or_longrope_scaling(shipped, expected):
    from ctxeval.evals.sweep import length_dependent
    from ctxeval.specs import expand_specs

    (native,) = expand_specs(["native"])
    assert length_dependent(native, _lm_shipping(shipped)) is expected


def test_native_without_a_loaded_model_is_not_length_dependent():
    """The planners are called with lm=None (no model record): native then counts as static, no AttributeError."""
    from ctxeval.evals.sweep import length_dependent
    from ctxeval.specs import expand_specs

    (native,) = expand_specs(["native"])
    assert length_dependent(native, None) is False
    assert length_dependent(native, SimpleNamespace()) is False


@pytest.mark.parametrize(
    "method, expected",
    [
        ("none", False),
        ("pi:factor=2", False),
        ("yarn:factor=2", False),
        ("dynamic-ntk:factor=2", True),
        ("dynamic-yarn", True),
    ],
)
def test_a_method_is_length_dependent_as_its_registry_entry_says_whatever_the_checkpoint_ships(method, expected):
    from ctxeval.evals.sweep import length_dependent
    from ctxeval.specs import expand_specs

    (spec,) = expand_specs([method])
    for shipped in ("dynamic", "default"):
        assert length_dependent(spec, _lm_shipping(shipped)) is expected


def test_plan_groups_one_forward_per_length_for_a_dynamic_method_or_when_items_are_fewer_than_ranks():
    from ctxeval.evals.sweep import plan_groups

    assert plan_groups([100, 200, 300], False, False) == [[100, 200, 300]]
    assert plan_groups([100, 200, 300], True, False) == [[100], [200], [300]]
    assert plan_groups([100, 200, 300], False, True) == [[100], [200], [300]]
    assert plan_groups([100, 200], True, True) == [[100], [200]]
    assert plan_groups([], True, True) == [] and plan_groups([], False, False) == []


def _docs(*ids):
    return [SimpleNamespace(doc_id=i) for i in ids]


def _items(monkeypatch, world, specs, docs, lengths, done=(), dynamic=()):
    from ctxeval.evals import sweep
    from ctxeval.runs import distributed
    from ctxeval.runs.rows import point_key

    monkeypatch.setattr(sweep, "current", lambda: distributed.Dist(0, world, 0))
    done = {point_key({"label": label, "length": L, "doc": d}, ("label", "length", "doc")) for label, L, d in done}
    return sweep.document_items(
        specs,
        docs,
        lengths,
        done,
        per_length=lambda s: s.name in dynamic,
        windows=lambda doc: {"a": 3}.get(doc.doc_id, 1),
        tokens=lambda spec, doc, group: 10 * len(group) + len(doc.doc_id),
    )


def test_document_items_one_forward_at_the_longest_length_for_a_static_method_weighted_by_windows(monkeypatch):
    from ctxeval.evals.sweep import DocumentBatch, WorkItem, forward_cost
    from ctxeval.specs import expand_specs

    specs = expand_specs(["none", "dynamic-ntk:factor=2"])
    a, b = docs = _docs("a", "b")
    items = _items(monkeypatch, 1, specs, docs, [512, 1024, 2048], done=[("none", 1024, "a")], dynamic={"dynamic-ntk"})
    assert items == [
        # static: one forward at the longest pending length serves the shorter ones; cost x the document's windows
        WorkItem(0, DocumentBatch((a,), (512, 2048)), 3 * forward_cost(2048), 21, 2048),
        WorkItem(0, DocumentBatch((b,), (512, 1024, 2048)), 1 * forward_cost(2048), 31, 2048),
        # dynamic: one forward per length, each its own item
        WorkItem(1, DocumentBatch((a,), (512,)), 3 * forward_cost(512), 11, 512),
        WorkItem(1, DocumentBatch((a,), (1024,)), 3 * forward_cost(1024), 11, 1024),
        WorkItem(1, DocumentBatch((a,), (2048,)), 3 * forward_cost(2048), 11, 2048),
        WorkItem(1, DocumentBatch((b,), (512,)), forward_cost(512), 11, 512),
        WorkItem(1, DocumentBatch((b,), (1024,)), forward_cost(1024), 11, 1024),
        WorkItem(1, DocumentBatch((b,), (2048,)), forward_cost(2048), 11, 2048),
    ]
    assert items[0].cost == 3 * (2048 + 2048**2 / 16384)  # written out: 3 windows of one 2048-token forward


@pytest.mark.parametrize("world, few", [(1, False), (2, False), (3, True), (4, True)])
def test_document_items_split_lengths_when_pending_documents_are_fewer_than_ranks(monkeypatch, world, few):
    """Two (method, document) pairs have pending lengths (a third is done): with more ranks than that, every length
    is its own item so that every rank gets work; with as many ranks or fewer, one forward per document."""
    from ctxeval.specs import expand_specs

    specs = expand_specs(["none"])
    docs = _docs("a", "b", "c")
    done = [("none", L, "c") for L in (512, 1024)]
    items = _items(monkeypatch, world, specs, docs, [512, 1024], done=done)
    groups = [(it.payload.document.doc_id, it.payload.lengths) for it in items]
    if few:
        assert groups == [("a", (512,)), ("a", (1024,)), ("b", (512,)), ("b", (1024,))]
    else:
        assert groups == [("a", (512, 1024)), ("b", (512, 1024))]


def test_an_attention_method_reads_the_frequencies_the_rotary_module_holds_at_call_time(llama):
    """rotary_frequencies returns a getter: it sees a frequency method's change after it was made."""
    import torch

    from ctxeval.evals.sweep import rotary_frequencies
    from ctxeval.rope.geometry import rope_info_from_config
    from ctxeval.rope.patching import find_rotary_modules
    from ctxeval.specs import expand_specs

    (spec,) = expand_specs(["self-extend"])
    lm = SimpleNamespace(model=llama, rope=rope_info_from_config(llama.config))
    get = rotary_frequencies(lm, spec)
    ((_, module),) = find_rotary_modules(llama)
    assert torch.equal(get(), module.inv_freq)
    module.inv_freq = module.inv_freq / 4  # what a method's patch does
    assert torch.equal(get(), module.inv_freq)


def test_an_attention_method_on_a_model_without_rope_is_refused_in_one_line(llama):
    from ctxeval.errors import CtxevalError
    from ctxeval.evals.sweep import rotary_frequencies
    from ctxeval.rope.geometry import RopeInfo
    from ctxeval.specs import expand_specs

    (spec,) = expand_specs(["self-extend"])
    with pytest.raises(CtxevalError, match="has no RoPE; use --method none"):
        rotary_frequencies(SimpleNamespace(model=llama, rope=RopeInfo(None)), spec)


class _Store:
    """What run_items uses of a RunStore: run.json's record (updated with the methods' read-back records)."""

    def __init__(self, record=None):
        self.record, self.updates = dict(record or {}), []

    def update(self, **fields):
        self.updates.append(fields)
        self.record.update(fields)


class _Progress:
    def __init__(self):
        self.total = None

    def start(self, total):
        self.total = total

    def advance(self, amount, description):
        pass

    def note(self, message):
        pass


def _tiny_lm(llama):
    from ctxeval.rope.geometry import rope_info_from_config

    return SimpleNamespace(model=llama, rope=rope_info_from_config(llama.config), device="cpu")


def _rank(monkeypatch, rank, world):
    from ctxeval.evals import sweep
    from ctxeval.runs import distributed

    class Rank(distributed.Dist):
        def barrier(self):  # no process group in a test
            pass

    monkeypatch.setattr(sweep, "current", lambda: Rank(rank, world, 0))


def test_run_items_measures_one_method_at_a_time_shortest_first_under_that_method(llama):
    """Each spec's items run under that spec's applied method, in ascending length; a spec without items is neither
    applied nor recorded, and the specs after it still run; progress counts every item's tokens."""
    from ctxeval.evals.sweep import WorkItem, run_items
    from ctxeval.specs import expand_specs

    specs = expand_specs(["none", "ntk:factor=2", "pi:factor=4"])
    items = [
        WorkItem(2, "p-long", 5.0, 300, 300),
        WorkItem(0, "n-long", 1.0, 200, 200),
        WorkItem(2, "p-short", 1.0, 7, 100),
        WorkItem(0, "n-short", 1.0, 5, 100),
    ]
    store, progress, seen = _Store({"methods": {"earlier": {"method": "yarn"}}}), _Progress(), []

    run_items(
        _tiny_lm(llama),
        specs,
        items,
        (100, 200, 300),
        store,
        progress,
        lambda spec, payload, handle: seen.append((spec.label, payload, handle.method.name)),
    )
    assert seen == [
        ("none", "n-short", "none"),
        ("none", "n-long", "none"),
        (specs[2].label, "p-short", "pi"),
        (specs[2].label, "p-long", "pi"),
    ]
    assert progress.total == 512
    # run.json's methods: the earlier record kept, the two measured methods' read-backs added, ntk not applied
    assert set(store.record["methods"]) == {"earlier", "none", specs[2].label}
    assert store.record["methods"]["earlier"] == {"method": "yarn"}
    assert store.record["methods"][specs[2].label]["method"] == "pi"
    assert store.record["methods"][specs[2].label]["attention_temperature"] == 1.0


@pytest.mark.parametrize("rank", [0, 1])
def test_run_items_under_torchrun_rank0_records_every_method_and_each_rank_measures_its_lpt_share(
    llama, monkeypatch, rank
):
    """With 2 ranks the items are dealt by cost (longest first to the least-loaded rank); rank 0 also records every
    method's read-back first, even one it measures nothing of, so run.json is complete; rank 1 records only what it
    measures."""
    from ctxeval.evals.sweep import WorkItem, run_items
    from ctxeval.specs import expand_specs

    _rank(monkeypatch, rank, 2)
    specs = expand_specs(["none", "pi:factor=4"])
    # costs 10, 6, 5, 1 -> rank 0: 10 and 1 (spec 0 only); rank 1: 6 and 5 (spec 1 and spec 0)
    items = [
        WorkItem(0, "a", 10.0, 1, 100),
        WorkItem(1, "b", 6.0, 2, 200),
        WorkItem(0, "c", 5.0, 4, 300),
        WorkItem(0, "d", 1.0, 8, 50),
    ]
    store, progress, seen = _Store(), _Progress(), []
    run_items(
        _tiny_lm(llama),
        specs,
        items,
        (50, 100, 200, 300),
        store,
        progress,
        lambda spec, payload, handle: seen.append((spec.label, payload)),
    )
    if rank == 0:
        assert seen == [("none", "d"), ("none", "a")] and progress.total == 9
        assert set(store.record["methods"]) == {"none", specs[1].label}
        assert store.record["methods"][specs[1].label]["method"] == "pi"
    else:
        assert seen == [("none", "c"), (specs[1].label, "b")] and progress.total == 6
        assert set(store.record["methods"]) == {"none", specs[1].label}
        assert len(store.updates) == 2


def test_run_items_single_process_records_only_the_methods_it_measures(llama, monkeypatch):
    from ctxeval.evals.sweep import WorkItem, run_items
    from ctxeval.specs import expand_specs

    _rank(monkeypatch, 0, 1)
    specs = expand_specs(["none", "pi:factor=4"])
    store = _Store()
    run_items(
        _tiny_lm(llama),
        specs,
        [WorkItem(1, "b", 1.0, 1, 100)],
        (100,),
        store,
        _Progress(),
        lambda spec, payload, handle: None,
    )
    assert list(store.record["methods"]) == [specs[1].label] and len(store.updates) == 1


# ---------------------------------------------------------------------------------------------------------------
# tables


def test_latest_rows_keeps_the_last_row_of_a_key_in_the_order_the_kept_rows_were_written():
    from ctxeval.report.tables import latest_rows

    rows = [
        {"label": "a", "length": 1, "v": 1},
        {"label": "b", "length": 1, "v": 2},
        {"label": "a", "length": 1, "v": 3},
        {"label": "a", "length": 2, "v": 4},
    ]
    df = latest_rows(rows, ("label", "length"))  # no status column: every row counts as measured
    assert list(zip(df["label"], df["length"], df["v"])) == [("b", 1, 2), ("a", 1, 3), ("a", 2, 4)]
    assert list(df.columns) == ["label", "length", "v"]
    assert latest_rows([], ("label",)).empty


def test_latest_rows_keys_on_every_field_given():
    from ctxeval.report.tables import latest_rows

    rows = [
        {"model": "m", "label": "a", "length": 1, "status": "ok", "v": 1},
        {"model": "n", "label": "a", "length": 1, "status": "ok", "v": 2},
        {"model": "m", "label": "a", "length": 1, "status": "oom", "v": 3},
    ]
    df = latest_rows(rows, ("model", "label", "length"))
    assert list(zip(df["model"], df["v"])) == [("m", 1), ("n", 2)]
    # a later measurement replaces an earlier one; among failures the later one is kept
    rows += [
        {"model": "m", "label": "a", "length": 1, "status": "ok", "v": 5},
        {"model": "x", "label": "a", "length": 1, "status": "oom", "v": 6},
        {"model": "x", "label": "a", "length": 1, "status": "skipped", "v": 7},
    ]
    df = latest_rows(rows, ("model", "label", "length"))
    assert list(zip(df["model"], df["v"])) == [("n", 2), ("m", 5), ("x", 7)]


def test_valid_lengths_a_ppl_exactly_at_the_tolerance_is_valid_and_the_x_columns_divide_by_the_original_length():
    import pandas as pd

    from ctxeval.report.tables import valid_lengths

    # tolerance 25% (exact in binary): own reference 8.0 at 64, so 10.0 is exactly at the limit (valid), 10.5 is
    # not; the base (`none`) is 4.0 at 64, its limit 5.0
    wide = pd.DataFrame(
        {32: [9.0, 3.0], 64: [8.0, 4.0], 128: [10.0, 5.0], 256: [10.5, 5.0], 512: [9.0, 6.0]},
        index=["pi(factor=2)", "none"],
    )
    assert 8.0 * (1 + 0.25) == 10.0 and 4.0 * (1 + 0.25) == 5.0
    valid = valid_lengths(wide, 64, 0.25).set_index("method")
    own, base = "longest within 25% of own ppl", "longest within 25% of none"
    assert list(valid["reference length"]) == [64, 64] and list(valid["ppl at reference"]) == [8.0, 4.0]
    assert valid.loc["pi(factor=2)", own] == 128 and valid.loc["pi(factor=2)", "x original"] == 2.0
    assert pd.isna(valid.loc["pi(factor=2)", base]) and pd.isna(valid.loc["pi(factor=2)", "x original (vs base)"])
    assert valid.loc["none", own] == 256 and valid.loc["none", base] == 256  # 5.0 is exactly 1.25 x 4.0
    assert valid.loc["none", "x original"] == 4.0 and valid.loc["none", "x original (vs base)"] == 4.0


def test_valid_lengths_the_reference_is_the_longest_length_up_to_the_original_else_the_shortest():
    import pandas as pd

    from ctxeval.report.tables import valid_lengths

    wide = pd.DataFrame({100: [5.0], 200: [5.2], 400: [9.0]}, index=["yarn(factor=4)"])
    # original 150: the reference is 100 (the longest <= 150), not 200
    valid = valid_lengths(wide, 150, 0.05)
    assert valid.iloc[0]["reference length"] == 100 and valid.iloc[0]["ppl at reference"] == 5.0
    assert valid.iloc[0]["longest within 5% of own ppl"] == 200
    assert valid.iloc[0]["x original"] == pytest.approx(200 / 150)
    # original 50: nothing <= 50 was measured, the shortest length is the reference
    valid = valid_lengths(wide, 50, 0.05)
    assert valid.iloc[0]["reference length"] == 100 and valid.iloc[0]["longest within 5% of own ppl"] == 200
    assert valid.iloc[0]["x original"] == 4.0
    # original exactly a measured length: that length is the reference
    assert valid_lengths(wide, 200, 0.05).iloc[0]["reference length"] == 200
    # no base row: the base column is named 'base' and empty
    assert valid.columns[5] == "longest within 5% of base" and valid.iloc[0][valid.columns[5]] is None


def test_valid_lengths_a_missing_cell_stops_the_valid_range_and_a_missing_reference_has_none():
    import pandas as pd

    from ctxeval.report.tables import valid_lengths

    nan = float("nan")
    wide = pd.DataFrame({64: [4.0, nan], 128: [nan, 4.0], 256: [4.0, 4.0]}, index=["none", "pi(factor=4)"])
    valid = valid_lengths(wide, 64, 0.10).set_index("method")
    own, base = "longest within 10% of own ppl", "longest within 10% of none"
    assert valid.loc["none", own] == 64  # the OOM at 128 stops it, though 256 is fine
    assert valid.loc["pi(factor=4)", own] is None or pd.isna(valid.loc["pi(factor=4)", own])  # no own reference
    assert pd.isna(valid.loc["pi(factor=4)", "x original"])
    assert valid.loc["pi(factor=4)", base] is None or pd.isna(valid.loc["pi(factor=4)", base])  # NaN at 64 stops it


def test_effective_length_an_accuracy_equal_to_the_threshold_passes_and_a_missing_length_stops_it():
    import pandas as pd

    from ctxeval.report.tables import effective_length

    assert effective_length(pd.Series({4: 0.8, 1: 0.9, 2: 0.8, 8: 0.79}), 0.8) == 4  # unsorted input, ties pass
    assert effective_length(pd.Series({1: 1.0, 2: float("nan"), 4: 1.0}), 0.5) == 1
    assert effective_length(pd.Series({1: 1.0, 2: None, 4: 1.0}, dtype=object), 0.5) == 1
    assert effective_length(pd.Series({1: 1.0, 2: 1.0}), 0.5) == 2 and isinstance(
        effective_length(pd.Series({1.0: 1.0}), 0.5), int
    )
    assert effective_length(pd.Series(dtype=float), 0.5) is None


def test_yarn_passkey_figures_the_longest_passing_length_and_the_mean_up_to_it():
    import pandas as pd

    from ctxeval.report.tables import yarn_passkey_figures

    acc = pd.Series({1024: 1.0, 2048: 0.5, 4096: 0.9, 8192: 0.2, 16384: float("nan")})
    assert yarn_passkey_figures(acc, 0.9) == (4096, pytest.approx((1.0 + 0.5 + 0.9) / 3))  # 0.9 >= 0.9 passes
    assert yarn_passkey_figures(acc, 0.5) == (4096, pytest.approx(0.8))
    assert yarn_passkey_figures(acc, 0.2) == (8192, pytest.approx(2.6 / 4))  # NaN is not a length evaluated
    context, mean = yarn_passkey_figures(acc, 1.01)
    assert context is None and math.isnan(mean)
    context, mean = yarn_passkey_figures(pd.Series({512.0: 1.0, 256.0: 0.0}), 1.0)
    assert context == 512 and isinstance(context, int) and mean == 0.5
    context, mean = yarn_passkey_figures(pd.Series({1: None, 2: 1.0}, dtype=object), 1.0)
    assert (context, mean) == (2, 1.0)
    # a length without an accuracy (NaN) below the context is not evaluated: the mean is over the others
    assert yarn_passkey_figures(pd.Series({1: float("nan"), 2: 0.5, 4: 1.0}), 1.0) == (4, 0.75)


def test_ruler_effective_length_a_missing_mean_stops_it():
    from ctxeval.report.tables import ruler_effective_length

    assert ruler_effective_length({4096: 90.0, 1024: 95.0, 2048: float("nan")}, 85.6) == 1024
    assert ruler_effective_length({1024: 95.0, 2048: None, 4096: 99.0}, 85.6) == 1024
    assert ruler_effective_length({1024: 85.6}, 85.6) is None and ruler_effective_length({}, 85.6) is None
    assert ruler_effective_length({1024.0: 85.7}, 85.6) == 1024 and isinstance(
        ruler_effective_length({1024.0: 85.7}, 85.6), int
    )


# ---------------------------------------------------------------------------------------------------------------
# ruler_eval


def test_ruler_config_refuses_each_bad_field_in_one_line_naming_it():
    from ctxeval.errors import CtxevalError
    from ctxeval.evals.ruler.run import RulerConfig
    from ctxeval.evals.ruler.tasks import TASKS

    names = ", ".join(TASKS)
    with pytest.raises(CtxevalError) as exc:
        RulerConfig((), (1024,), 1)
    assert str(exc.value) == f"--tasks names no RULER task; tasks: {names}"
    with pytest.raises(CtxevalError) as exc:
        RulerConfig(("vt", "niah_x", "niah_y"), (1024,), 1)
    assert str(exc.value) == f"unknown RULER task 'niah_x'; tasks: {names}"
    with pytest.raises(CtxevalError) as exc:
        RulerConfig(("vt",), (1024,), 0)
    assert str(exc.value) == "--samples must be >= 1, got 0"
    with pytest.raises(CtxevalError) as exc:
        RulerConfig(("vt",), (), 1)
    assert str(exc.value) == "give at least one --lengths value"
    with pytest.raises(CtxevalError, match="unknown RULER model template 'chat'"):
        RulerConfig(("vt",), (1024,), 1, template="chat")
    cfg = RulerConfig(("vt", "fwe"), (1024,), 1, template="meta-chat")  # one sample is enough
    assert (cfg.samples, cfg.seed, cfg.template) == (1, 42, "meta-chat")


@pytest.mark.parametrize(
    "record, problem",
    [
        ([1], "not a JSON object"),
        ({"outputs": ["a"]}, "KeyError: 'input'"),
        ({"input": "x"}, "KeyError: 'outputs'"),
        ({"input": 3, "outputs": ["a"]}, "input is not text"),
        ({"input": "x", "outputs": "a"}, "outputs is not a non-empty list of answers"),
        ({"input": "x", "outputs": []}, "outputs is not a non-empty list of answers"),
        ({"input": "x", "outputs": ["a", True]}, "outputs is not a non-empty list of answers"),
        ({"input": "x", "outputs": ["a", None]}, "outputs is not a non-empty list of answers"),
        ({"input": "x", "outputs": ["a"], "answer_prefix": 1}, "answer_prefix is not text"),
        ({"input": "x", "outputs": ["a"], "length": 1.5}, "length is not a whole number of tokens"),
        ({"input": "x", "outputs": ["a"], "length": -2}, "length is not a whole number of tokens"),
        ({"input": "x", "outputs": ["a"], "length": None}, "length is not a whole number of tokens"),
        ({"input": "x", "outputs": ["a"], "length": 2**31}, "length is not a whole number of tokens"),  # > MAX_TOKENS
        ({"input": "x", "outputs": ["a"], "token_position_answer": "7"}, "token_position_answer is not a whole number"),
        ({"input": "x", "outputs": ["a"], "token_position_answer": 2.5}, "token_position_answer is not a whole number"),
    ],
)
def test_a_record_that_is_not_a_ruler_sample_is_named_by_its_first_problem(record, problem):
    from ctxeval.evals.ruler.run import sample_problem

    assert sample_problem(record) == problem


@pytest.mark.parametrize(
    "record",
    [
        {"input": "x", "outputs": ["a", 1, 2.5]},
        {"input": "", "outputs": [0], "answer_prefix": "", "length": -1},  # RULER's -1: length not recorded
        {"input": "x", "outputs": ["a"], "length": 128.0, "token_position_answer": 0},
        {"input": "x", "outputs": ["a"], "length": 0},
        {"input": "x", "outputs": ["a"], "length": 2**31 - 1},  # MAX_TOKENS
        {"input": "x", "outputs": ["a"], "token_position_answer": None, "index": "anything"},
    ],
)
def test_a_ruler_sample_with_numbers_as_answers_and_optional_fields_is_accepted(record):
    from ctxeval.evals.ruler.run import sample_problem

    assert sample_problem(record) is None


def test_the_ruler_sweep_plans_pending_samples_in_batches_and_passes_each_to_measure(monkeypatch):
    from ctxeval.evals.ruler import run as RE
    from ctxeval.evals.ruler.tasks import RulerSample
    from ctxeval.evals.sweep import WorkItem, forward_cost
    from ctxeval.specs import expand_specs

    specs = expand_specs(["none", "pi:factor=2"])
    sample = lambda i: RulerSample(i, f"prompt {i}", ["a"], 10, "")  # noqa: E731
    prompts = {("vt", 1024): [sample(0), sample(1), sample(2)], ("fwe", 2048): [sample(0), sample(1)]}
    cfg = RE.RulerConfig(("vt", "fwe"), (1024, 2048), 3)
    runner = RE.RulerRunner(None, None, "cpu", "tiny", batch_size=2)
    done = [
        {"label": "none", "ruler_task": "vt", "length": 1024, "sample": 1, "status": "ok"},
        {"label": "none", "ruler_task": "fwe", "length": 2048, "sample": 0, "status": "oom"},
    ]

    class Store:
        def __init__(self):
            self.rows = list(done)

        def done_points(self, key):
            from ctxeval.runs.rows import point_key

            return {point_key(r, key) for r in self.rows if r["status"] == "ok"}

        def append(self, rows):
            self.rows.extend(rows)

    planned, measured = {}, []

    def run_items(lm, specs_, items, lengths, store, progress, work):
        planned.update(items=items, lengths=lengths, progress=progress)
        for item in items:
            work(specs_[item.spec_index], item.payload, "handle")

    monkeypatch.setattr(RE, "run_items", run_items)
    monkeypatch.setattr(
        runner,
        "measure",
        lambda spec, task, length, samples, emit, handle=None, of=None: measured.append(
            (spec.label, task, length, [s.index for s in samples], emit.__name__, handle, of)
        ),
    )
    RE.sweep(None, specs, prompts, cfg, runner, Store())
    s = prompts[("vt", 1024)], prompts[("fwe", 2048)]
    assert planned["items"] == [
        WorkItem(0, RE.RulerBatch("vt", 1024, (s[0][0], s[0][2]), 3), 2 * forward_cost(1024), 2048, 1024),
        WorkItem(0, RE.RulerBatch("fwe", 2048, (s[1][0], s[1][1]), 2), 2 * forward_cost(2048), 4096, 2048),
        WorkItem(1, RE.RulerBatch("vt", 1024, (s[0][0], s[0][1]), 3), 2 * forward_cost(1024), 2048, 1024),
        WorkItem(1, RE.RulerBatch("vt", 1024, (s[0][2],), 3), forward_cost(1024), 1024, 1024),
        WorkItem(1, RE.RulerBatch("fwe", 2048, (s[1][0], s[1][1]), 2), 2 * forward_cost(2048), 4096, 2048),
    ]
    assert planned["lengths"] == (1024, 2048) and planned["progress"] is runner.progress
    assert measured[0] == ("none", "vt", 1024, [0, 2], "append", "handle", 3)
    assert measured[3] == (specs[1].label, "vt", 1024, [2], "append", "handle", 3)


# ---------------------------------------------------------------------------------------------------------------
# runs


def _run(name, order, rows, started=None, methods=None, dtype="float32"):
    from pathlib import Path

    from ctxeval.report.runs import Run

    record = {"spec": {"task": "ppl", "dtype": dtype, **({"methods": methods} if methods else {})}}
    if started:
        record["started"] = started
    return Run(Path(name), name, "ppl", record, rows, order)


def _group(*runs):
    from ctxeval.report.runs import Group

    return Group("ppl-1", "ppl", 1, 1, {}, list(runs))


def _ppl(label, length, doc="d", status="ok", value=1.0, model="m"):
    return {"model": model, "label": label, "length": length, "doc": doc, "status": status, "nll_sum": value}


def test_merge_rows_the_run_started_later_wins_whatever_the_command_line_order_and_says_so():
    from ctxeval.report.runs import merge_rows

    older = _run("old", 1, [_ppl("none", 64, value=1.0), _ppl("none", 128, value=2.0)], "2026-01-01T10:00:00")
    newer = _run("new", 0, [_ppl("none", 64, value=3.0), _ppl("none", 128.0, value=4.0)], "2026-01-02T10:00:00+00:00")
    rows, notes = merge_rows(_group(newer, older))
    assert sorted((r["length"], r["nll_sum"]) for r in rows) == [(64, 3.0), (128, 4.0)]
    assert all(type(r["length"]) is int for r in rows)  # 128.0 and 128 are one point
    assert notes == ["m · none: 2 point(s) measured by both old and new; kept new's (started later)"]


def test_merge_rows_without_a_start_time_a_run_counts_as_oldest_and_ties_go_to_the_later_argument():
    from ctxeval.report.runs import merge_rows

    undated = _run("undated", 1, [_ppl("none", 64, value=1.0)])
    dated = _run("dated", 0, [_ppl("none", 64, value=2.0)], "2000-01-01T00:00:00")
    rows, notes = merge_rows(_group(undated, dated))
    assert [r["nll_sum"] for r in rows] == [2.0] and "kept dated's" in notes[0]
    same = "2026-01-01T00:00:00"
    first, second = (
        _run("first", 0, [_ppl("none", 64, value=1.0)], same),
        _run("second", 1, [_ppl("none", 64, value=2.0)], same),
    )
    rows, notes = merge_rows(_group(second, first))
    assert [r["nll_sum"] for r in rows] == [2.0]
    assert notes == ["m · none: 1 point(s) measured by both first and second; kept second's (started later)"]


def test_merge_rows_a_failure_never_replaces_a_value_but_replaces_a_failure_and_a_value_replaces_a_failure():
    from ctxeval.report.runs import merge_rows

    older = _run(
        "a",
        0,
        [
            _ppl("none", 64, value=1.0),
            _ppl("none", 128, status="oom", value=None),
            _ppl("none", 256, status="oom", value=None),
        ],
        "2026-01-01T00:00:00",
    )
    newer = _run(
        "b",
        1,
        [
            _ppl("none", 64, status="oom", value=None),
            _ppl("none", 128, value=5.0),
            _ppl("none", 256, status="skipped", value=None),
        ],
        "2026-01-02T00:00:00",
    )
    rows, notes = merge_rows(_group(older, newer))
    assert sorted((r["length"], r["status"], r["nll_sum"]) for r in rows) == [
        (64, "ok", 1.0),
        (128, "ok", 5.0),
        (256, "skipped", None),
    ]
    assert sorted(notes) == [
        "m · none: 1 point(s) measured by both a and b; kept a's values (b has oom there; a failure never replaces "
        "a value)",
        "m · none: 2 point(s) measured by both a and b; kept b's (started later)",
    ]


def test_merge_rows_within_a_run_the_last_row_of_a_point_wins_and_points_differ_by_every_field():
    from ctxeval.report.runs import merge_rows

    run = _run(
        "r",
        0,
        [
            _ppl("none", 64, status="oom", value=None),
            _ppl("none", 64, value=7.0),
            _ppl("none", 64, doc="e", value=8.0),
            _ppl("pi", 64, value=9.0),
        ],
        "2026-01-01T00:00:00",
    )
    rows, notes = merge_rows(_group(run))
    assert [(r["label"], r["doc"], r["nll_sum"]) for r in rows] == [
        ("none", "d", 7.0),
        ("none", "e", 8.0),
        ("pi", "d", 9.0),
    ]
    assert notes == []


def test_merge_rows_one_model_in_two_dtypes_stays_two_rows_named_by_dtype():
    from ctxeval.report.runs import merge_rows, row_order

    a = _run("a", 0, [_ppl("none", 64, value=1.0)], "2026-01-01T00:00:00", dtype="float32")
    b = _run("b", 1, [_ppl("none", 64, value=2.0)], "2026-01-02T00:00:00", dtype="bfloat16")
    group = _group(a, b)
    rows, notes = merge_rows(group)
    assert sorted((r["model"], r["nll_sum"]) for r in rows) == [("m (bfloat16)", 2.0), ("m (float32)", 1.0)]
    assert notes == [] and row_order(group, rows) == [("m (float32)", "none"), ("m (bfloat16)", "none")]


def test_row_order_models_as_they_first_appear_methods_in_each_runs_order_only_those_with_rows():
    from ctxeval.report.runs import merge_rows, row_order

    # run 0 (second on the list) names yarn before none in its spec; its rows add pi; run 1 adds model n
    first = _run(
        "first",
        0,
        [_ppl("pi", 64, model="m"), _ppl("none", 64, model="m"), _ppl("yarn", 64, model="m")],
        "2026-01-02T00:00:00",
        methods=["yarn", "none", "ntk"],
    )
    second = _run(
        "second",
        1,
        [_ppl("none", 64, model="n"), _ppl("pi", 64, model="m"), _ppl("none", 128, model="m")],
        "2026-01-01T00:00:00",
    )
    group = _group(second, first)
    rows, _ = merge_rows(group)
    assert row_order(group, rows) == [("m", "yarn"), ("m", "none"), ("m", "pi"), ("n", "none")]
    # only pairs that have rows: ntk (named, never measured) is left out, and so is everything without a row
    assert row_order(group, [r for r in rows if r["label"] != "yarn"]) == [("m", "none"), ("m", "pi"), ("n", "none")]


# ---------------------------------------------------------------------------------------------------------------
# ruler


def test_the_size_search_returns_the_largest_fitting_size_in_the_range_else_the_start():
    from ctxeval.evals.ruler import generate as R

    probes = []

    def make(n):
        probes.append(n)
        return "ab" * n, []

    assert R._search(make, lambda text: len(text) <= 1000, 5, 10_000) == 500
    assert len(probes) <= 14  # bisection: about log2(10_000) probes
    assert R._search(make, lambda text: len(text) <= 1000, 5, 500) == 500  # the upper bound itself fits
    assert R._search(make, lambda text: len(text) <= 1000, 500, 500) == 500
    assert R._search(make, lambda text: len(text) <= 1000, 499, 499) == 499
    assert R._search(make, lambda text: len(text) <= 1000, 501, 600) == 501  # none fits: the start
    assert R._search(make, lambda text: len(text) <= 1000, 7, 8) == 8
    assert R._search(make, lambda text: len(text) <= 14, 7, 8) == 7
    assert R._search(make, lambda text: False, 7, 7) == 7


def test_the_size_search_refuses_a_haystack_that_never_fills_the_prompt():
    from ctxeval.errors import CtxevalError
    from ctxeval.evals.ruler import generate as R

    make = lambda n: ("same text whatever the size", [])  # noqa: E731 (an empty essay file)
    with pytest.raises(CtxevalError) as exc:
        R._search(make, lambda text: True, 5, 400, unfilled=lambda: "the essays are empty")
    assert str(exc.value) == "the essays are empty"
    assert R._search(make, lambda text: True, 5, 400) == 400  # without `unfilled`, the upper bound
    assert R._search(lambda n: ("ab" * n, []), lambda t: len(t) <= 10, 1, 400, unfilled=lambda: "x") == 5


@pytest.mark.parametrize(
    "family, expected", [("niah", 750), ("variable_tracking", 750), ("common_words_extraction", 500)]
)
def test_the_search_bound_is_three_times_the_size_the_length_needs_twice_for_cwe(family, expected):
    from ctxeval.evals.ruler import generate as R

    calls = []

    def make(n):
        calls.append(n)
        return "x" * (4 * n), []  # 4 tokens per unit

    count = len
    assert R._upper(make, count, 1000, 64, 10, family) == expected  # 1000 tokens need 250 units
    assert calls == [64]
    assert R._upper(make, count, 1000, 64, 600, family) == 1200  # never under two steps


def test_the_search_bound_rounds_as_ruler_does():
    from ctxeval.evals.ruler import generate as R

    make = lambda n: ("x" * (3 * n), [])  # noqa: E731 (3 tokens per unit: 1000 / 3 = 333.3 units)
    assert R._upper(make, len, 1000, 10, 1, "niah") == 1000  # int(333.33 x 3)
    assert R._upper(make, len, 1000, 10, 1, "common_words_extraction") == 666  # int(1000 // 3) x 2


def test_postprocess_strips_and_turns_every_control_character_into_a_newline():
    from ctxeval.evals.ruler.generate import postprocess

    assert postprocess(" \n a\x01b\x1fc d\x7f \t") == "a\nb\nc d\x7f"
    assert postprocess("x\x00\x00y") == "x\n\ny"
    assert postprocess("\x00 answer \x1f") == "answer"


def test_score_all_is_the_share_found_and_part_is_any_found_case_insensitively():
    from ctxeval.evals.ruler.generate import score

    refs = ["Alpha", "beta", "GAMMA", "delta"]
    assert score("string_match_all", "ALPHA and Gamma", refs) == 0.5
    assert score("string_match_all", "alpha beta gamma delta", refs) == 1.0
    assert score("string_match_all", "nothing", refs) == 0.0
    assert score("string_match_part", "only gamma here", refs) == 1.0
    assert score("string_match_part", "nothing", refs) == 0.0
    assert score("string_match_all", "beta", ["beta"]) == 1.0 and score("string_match_part", "b", ["beta"]) == 0.0


def test_a_ruler_sample_record_is_rulers_jsonl_line():
    from ctxeval.evals.ruler.tasks import RulerSample

    sample = RulerSample(3, "the input", ["a", "b"], 120, " Answer:", 17)
    assert sample.record() == {
        "index": 3,
        "input": "the input",
        "outputs": ["a", "b"],
        "length": 120,
        "length_w_model_temp": 120,
        "answer_prefix": " Answer:",
        "token_position_answer": 17,
    }
    plain = RulerSample(0, "in", ["x"], 5, "", None).record()
    assert plain == {
        "index": 0,
        "input": "in",
        "outputs": ["x"],
        "length": 5,
        "length_w_model_temp": 5,
        "answer_prefix": "",
    }
    assert RulerSample(0, "in", ["x"], 5, "", 0).record()["token_position_answer"] == 0  # position 0 is kept
    assert sample.prompt == "the input Answer:"


def test_templates_are_checked_by_name_and_wrap_the_task_template_before_the_answer_prefix():
    from ctxeval.errors import CtxevalError
    from ctxeval.evals.ruler.tasks import FAMILIES, MODEL_TEMPLATES, TASKS, check_template, split_prefix, task_template

    assert check_template("meta-chat") == "meta-chat"
    with pytest.raises(CtxevalError) as exc:
        check_template("llama")
    assert str(exc.value) == (
        "unknown RULER model template 'llama'; templates (RULER's template.py): " + ", ".join(MODEL_TEMPLATES)
    )
    vt = FAMILIES["variable_tracking"]
    assert task_template(TASKS["vt"]) == vt.template + vt.answer_prefix
    assert task_template(TASKS["vt"], "meta-chat") == f"[INST] {vt.template} [/INST]{vt.answer_prefix}"
    # the answer prefix is found by its first 10 characters, the last occurrence
    text = "a Answer: b Answer: c" + " Answer: the end"
    qa = FAMILIES["qa"]
    assert qa.answer_prefix == " Answer:"
    assert split_prefix(text, qa) == ("a Answer: b Answer: c", " Answer: the end")
    long = FAMILIES["niah"]
    head = long.answer_prefix[:10]
    assert split_prefix(f"x{head}y{head} and more", long) == (f"x{head}y", f"{head} and more")


def test_the_samples_a_run_writes_read_back_as_the_same_prompts(tmp_path):
    """A resumed run reads its prompts back from samples/<length>/<task>/validation.jsonl: every field survives."""
    from ctxeval.evals.ruler.run import read_samples, samples_path, write_samples
    from ctxeval.evals.ruler.tasks import RulerSample

    samples = [
        RulerSample(0, "first input", ["a", "b"], 120, " Answer:", 17),
        RulerSample(1, "second input", ["c"], 119, " The code is", None),
    ]
    path = samples_path(tmp_path, "vt", 1024)
    assert path == tmp_path / "1024" / "vt" / "validation.jsonl"
    write_samples(path, samples)
    again = read_samples(path, "vt", 1024)
    assert again == samples and [s.prompt for s in again] == ["first input Answer:", "second input The code is"]
