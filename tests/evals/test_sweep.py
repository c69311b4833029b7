"""evals/sweep.py: which methods are length dependent, the work items, and running them in order."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ctxeval.evals.perplexity import batch_documents
from ctxeval.evals.sweep import DocumentBatch, WorkItem


def _doc(doc_id):
    return SimpleNamespace(doc_id=doc_id)


def test_a_one_document_batch_gives_its_document_and_a_merged_one_refuses():
    a, b = _doc("a"), _doc("b")
    assert DocumentBatch((a,), (16, 32)).document is a
    with pytest.raises(ValueError):
        _ = DocumentBatch((a, b), (16,)).document


def test_batch_documents_merges_the_documents_of_one_method_waiting_for_the_same_lengths():
    a, b, c, d = map(_doc, "abcd")
    items = [
        WorkItem(0, DocumentBatch((a,), (16, 32)), 1.0, 10, 32),
        WorkItem(0, DocumentBatch((b,), (16, 32)), 2.0, 20, 32),
        WorkItem(0, DocumentBatch((c,), (16, 32)), 4.0, 40, 32),
        WorkItem(0, DocumentBatch((d,), (32,)), 8.0, 80, 32),
        WorkItem(1, DocumentBatch((a,), (16, 32)), 16.0, 160, 32),
    ]
    assert batch_documents(items, 2) == [
        WorkItem(0, DocumentBatch((a, b), (16, 32)), 3.0, 30, 32),
        WorkItem(0, DocumentBatch((c,), (16, 32)), 4.0, 40, 32),
        WorkItem(0, DocumentBatch((d,), (32,)), 8.0, 80, 32),
        WorkItem(1, DocumentBatch((a,), (16, 32)), 16.0, 160, 32),
    ]


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
