"""evals/needle.py's runner and sweep: batches, generation, out-of-memory halving, and the rows they write."""

import numpy as np
import pytest
import torch
from helpers import build_tokenizer, tiny_llama
from typer.testing import CliRunner

from ctxeval.cli import app
from ctxeval.data.presets import load_task
from ctxeval.evals import haystack as H
from ctxeval.evals import needle as N

runner = CliRunner()


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def preset(name):
    return H.NeedlePreset.from_dict(name, load_task(f"needle-{name}", "needle"))


def builder(tok, name, chat=False, snap=False, hay="filler"):
    ids, _ = H.haystack_tokens(tok, hay, 4000)
    return H.PromptBuilder(tok, preset(name), ids, chat_template=chat, snap=snap)


def test_forced_and_generate_agree(tok):
    """Same prompt: forced says correct exactly when greedy generation reproduces the answer tokens."""
    model = tiny_llama(vocab_size=len(tok))
    b = builder(tok, "gkamradt")
    cfg_forced = N.NeedleConfig((400,), (50.0,), scoring="forced")  # (the gkamradt prompt alone is ~300 tokens)
    r = N.NeedleRunner(model, tok, "cpu", b, cfg_forced, "tiny", "needle")
    item = r.item(400, 0, 0)
    with torch.no_grad():
        greedy = model.generate(
            torch.tensor([item.prompt.ids]), max_new_tokens=4, do_sample=False, pad_token_id=tok.eos_token_id
        )[0, len(item.prompt.ids) :].tolist()
    for answer_ids, expect in ((greedy, 1), ([(greedy[0] + 1) % len(tok)] + greedy[1:], 0)):
        item.prompt.answer_ids = answer_ids
        forced = r._forced([item])[0]
        assert forced["correct"] == expect
        text = tok.decode(answer_ids)
        item.sample = H.Sample(item.sample.needles, 1, "q", "a", (text.strip(),))
        gen_runner = N.NeedleRunner(
            model, tok, "cpu", b, N.NeedleConfig((400,), (50.0,), max_new_tokens=4), "tiny", "needle"
        )
        r_preset = H.NeedlePreset.from_dict("exact", {**load_task("needle-magic-number", "needle")})
        gen_runner.builder.preset = r_preset
        generated = gen_runner._generate(item, None)
        assert generated["correct"] == expect, (generated, text)


def needle(*args):
    return runner.invoke(app, ["needle", *args])


def test_a_needle_row_carries_what_was_asked_and_measured(tok):
    from ctxeval.specs import expand_specs

    model = tiny_llama(vocab_size=len(tok))
    runner_ = N.NeedleRunner(
        model,
        tok,
        "cpu",
        builder(tok, "magic-number-multivalue"),
        N.NeedleConfig((900,), (25.0,), scoring="forced"),
        "tiny",
        "needle",
    )
    item = runner_.item(900, 0, 0)
    (spec,) = expand_specs(["pi:factor=2"])
    row = runner_._row(spec, item, status="ok", correct=1, response=None)
    assert row == {
        "model": "tiny",
        "method": "pi",
        "label": spec.label,
        "params": spec.record_params,
        "task": "needle",
        "metric": "correct",
        "value": 1,
        "preset": "magic-number-multivalue",
        "scoring": "forced",
        "length": 900,
        "depth": 25.0,
        "sample": 0,
        "answer": ", ".join(item.sample.answers),
        "prompt_tokens": len(item.prompt.ids),
        "answer_tokens": len(item.prompt.answer_ids),
        "haystack_tokens": item.prompt.haystack_tokens,
        "status": "ok",
        "correct": 1,
        "response": None,
    }
    assert len(item.sample.answers) == 4 and row["haystack_tokens"] > 0


def test_a_generate_batch_is_the_leading_prompts_of_one_shape(tok):
    model = tiny_llama(vocab_size=len(tok))
    runner_ = N.NeedleRunner(
        model,
        tok,
        "cpu",
        builder(tok, "passkey"),
        N.NeedleConfig((600, 700), (50.0,), max_new_tokens=6),
        "tiny",
        "passkey",
    )  # one budget
    a, b, c = runner_.item(600, 0, 0), runner_.item(600, 0, 1), runner_.item(700, 0, 0)
    assert runner_._same_shape([a, b, c]) == [a, b] and runner_._same_shape([c, a]) == [c]
    assert runner_._same_shape([a]) == [a] and runner_._same_shape([a, b]) == [a, b]


def test_the_generation_budget_is_the_answer_and_eight_tokens(tok):
    b = builder(tok, "passkey")
    sample = H.make_sample(b.preset, np.random.default_rng(0))
    generate = N.NeedleRunner(None, tok, "cpu", b, N.NeedleConfig((600,), (50.0,)), "tiny", "passkey")
    assert generate.budget(sample) == len(b.answer_ids(sample)) + 8
    fixed = N.NeedleRunner(None, tok, "cpu", b, N.NeedleConfig((600,), (50.0,), max_new_tokens=3), "tiny", "passkey")
    assert fixed.budget(sample) == 3
    forced = N.NeedleRunner(None, tok, "cpu", b, N.NeedleConfig((600,), (50.0,), scoring="forced"), "tiny", "passkey")
    assert forced.budget(sample) == len(b.answer_ids(sample))


def test_out_of_memory_halves_the_batch_then_gives_the_length_up_and_skips_longer_ones(tok, monkeypatch):
    from ctxeval.evals.common import OomLadder, PointOOM
    from ctxeval.specs import expand_specs

    model = tiny_llama(vocab_size=len(tok))
    notes = []
    progress = type("P", (), {"note": lambda self, t: notes.append(t), "advance": lambda self, n, text: None})()
    cfg = N.NeedleConfig((600, 700, 800, 900), (50.0,), samples=3, scoring="forced", batch_size=4)
    runner_ = N.NeedleRunner(model, tok, "cpu", builder(tok, "passkey"), cfg, "tiny", "passkey", progress)
    real = runner_._forced
    fits = {600: 4, 700: 1, 800: 0}  # the largest batch that fits at each length (800: not even one)
    calls = []

    def forced(chunk):
        calls.append((chunk[0].length, len(chunk)))
        if len(chunk) > fits[chunk[0].length]:
            raise PointOOM(f"out of memory at {chunk[0].length}")
        return real(chunk)

    monkeypatch.setattr(runner_, "_forced", forced)
    (spec,) = expand_specs(["none"])
    rows, ladder = [], OomLadder()
    cells = [(n, 0, s) for n in (600, 700, 800, 900) for s in range(3)]
    runner_.measure(spec, cells, rows.extend, None, ladder)
    assert [(r["status"], r["note"]) for r in rows if r["length"] == 900] == [
        ("skipped", "skipped: out of memory at 800 tokens")
    ] * 3  # a longer length of the same call: a row each, skipped
    assert calls == [(600, 3), (700, 3), (700, 2), (700, 1), (700, 1), (700, 1), (800, 1)]  # 800 starts at 700's 1
    by_length = {n: [r for r in rows if r["length"] == n] for n in (600, 700, 800)}
    assert [r["status"] for r in by_length[600] + by_length[700]] == ["ok"] * 6
    assert all(r["seconds"] is not None and r["seconds"] >= 0 for r in by_length[600])
    assert [(r["status"], r["note"], r["correct"], r["sample"]) for r in by_length[800]] == [
        ("oom", "out of memory at 800", None, s) for s in range(3)
    ]
    assert notes == [
        "none: out of memory at 700 tokens; batch size 2",
        "none: out of memory at 700 tokens; batch size 1",
        "none: out of memory at 800 tokens; longer lengths skipped",
    ]
    assert ladder.skip_from == {"none": 800} and ladder.fitted == {("none", 700): 1}
    later = []  # another chunk of the same method: what ran out of memory is not tried again
    runner_.measure(spec, [(900, 0, 0), (800, 0, 1)], later.extend, None, ladder)
    assert [(r["length"], r["status"], r["note"], r["label"]) for r in later] == [
        (800, "skipped", "skipped: out of memory at 800 tokens", "none"),
        (900, "skipped", "skipped: out of memory at 800 tokens", "none"),
    ]
    assert calls[-1] == (800, 1)  # nothing ran


def test_generation_stops_at_every_stop_id_and_decodes_without_special_tokens(tok, monkeypatch):
    model = tiny_llama(vocab_size=len(tok))
    model.generation_config.eos_token_id = [tok.eos_token_id, 7]  # a second stop id, as Llama 3 ships
    b = builder(tok, "passkey")
    runner_ = N.NeedleRunner(model, tok, "cpu", b, N.NeedleConfig((600,), (50.0,), max_new_tokens=6), "tiny", "passkey")
    items = [runner_.item(600, 0, 0), runner_.item(600, 0, 0)]
    seen = {}

    def fake_generate(input_ids, attention_mask, generation_config):
        seen.update(mask=attention_mask.tolist(), eos=generation_config.eos_token_id)
        replies = [[40, 41, 7, 42, 0, 0], [tok.eos_token_id, 43, 0, 0, 0, 0]]  # stop at 7, at EOS
        return torch.cat([input_ids, torch.tensor(replies)], dim=1)

    monkeypatch.setattr(model, "generate", fake_generate)
    out = runner_._generate_batch(items, None)
    assert [o["response"] for o in out] == [tok.decode([40, 41], skip_special_tokens=True), ""]
    assert seen["eos"] == [tok.eos_token_id, 7] and seen["mask"] == [[1] * len(items[0].prompt.ids)] * 2
    special = [tok.bos_token_id, 40]  # a special token inside a reply is not part of the answer text
    monkeypatch.setattr(
        model,
        "generate",
        lambda input_ids, attention_mask, generation_config: torch.cat(
            [input_ids, torch.tensor([special + [7, 0, 0, 0]] * 2)], dim=1
        ),
    )
    assert runner_._generate_batch(items, None)[0]["response"] == tok.decode([40])


def test_generation_under_a_dynamic_method_freezes_the_rope_at_the_length(tok, monkeypatch):
    from ctxeval.rope.patching import apply_method

    model = tiny_llama(vocab_size=len(tok))
    runner_ = N.NeedleRunner(
        model, tok, "cpu", builder(tok, "passkey"), N.NeedleConfig((600,), (50.0,), max_new_tokens=2), "tiny", "passkey"
    )
    item = runner_.item(600, 0, 0)
    with apply_method(model, "dynamic-ntk", factor=2) as handle:
        frozen = []
        real = handle.freeze_length
        monkeypatch.setattr(handle, "freeze_length", lambda n: (frozen.append(n), real(n))[1])
        runner_._generate_batch([item], handle)
    assert frozen == [600, None]
    frozen.clear()  # through measure, as the sweep calls it
    with apply_method(model, "dynamic-ntk", factor=2) as handle:
        real = handle.freeze_length
        monkeypatch.setattr(handle, "freeze_length", lambda n: (frozen.append(n), real(n))[1])
        rows = []
        runner_.measure(handle_spec(), [(600, 0, 0)], rows.extend, handle)
    assert frozen == [600, None] and rows[0]["status"] == "ok"


def handle_spec():
    from ctxeval.specs import expand_specs

    return expand_specs(["dynamic-ntk:factor=2"])[0]


def test_a_row_records_the_seconds_per_prompt_of_its_batch(tok, monkeypatch):
    from ctxeval.specs import expand_specs

    cfg = N.NeedleConfig((600,), (0.0, 50.0, 100.0), samples=1, scoring="forced", batch_size=3)
    runner_ = N.NeedleRunner(None, tok, "cpu", builder(tok, "passkey"), cfg, "tiny", "passkey")
    monkeypatch.setattr(
        runner_, "_forced", lambda chunk: [{"correct": 1, "answer_nll": 0.0, "response": ""}] * len(chunk)
    )
    clock = iter([100.0, 101.0])  # one batch of three prompts measured in 1 s
    monkeypatch.setattr(N.time, "perf_counter", lambda: next(clock))
    rows = []
    runner_.measure(expand_specs(["none"])[0], cfg.cells(), rows.extend)
    assert [r["seconds"] for r in rows] == [0.333] * 3


def test_a_halved_batch_carries_to_longer_lengths_of_its_own_method_only(tok, monkeypatch):
    from ctxeval.evals.common import OomLadder, PointOOM
    from ctxeval.specs import expand_specs

    cfg = N.NeedleConfig((600, 700), (50.0,), samples=5, scoring="forced", batch_size=2)
    runner_ = N.NeedleRunner(None, tok, "cpu", builder(tok, "passkey"), cfg, "tiny", "passkey")
    calls = []

    def forced(chunk):
        calls.append((spec.label, chunk[0].length, len(chunk)))
        if spec.label == "none" and len(chunk) > 1:
            raise PointOOM("out of memory")
        return [{"correct": 1, "answer_nll": 0.0, "response": ""}] * len(chunk)

    monkeypatch.setattr(runner_, "_forced", forced)
    ladder = OomLadder()
    none, pi = expand_specs(["none", "pi:factor=2"])
    for spec in (none, pi):
        for cells in ([(600, 0, 0), (600, 0, 1)], [(600, 0, 2), (600, 0, 3)], [(700, 0, 0), (700, 0, 1)]):
            runner_.measure(spec, cells, lambda rows: None, None, ladder)
    # none: halved once at 600; its next chunk of 600 and the chunk of 700 start at 1; pi keeps its own batch of 2
    assert calls == [
        ("none", 600, 2),
        ("none", 600, 1),
        ("none", 600, 1),
        ("none", 600, 1),
        ("none", 600, 1),
        ("none", 700, 1),
        ("none", 700, 1),
        (pi.label, 600, 2),
        (pi.label, 600, 2),
        (pi.label, 700, 2),
    ]
    assert ladder.fitted == {("none", 600): 1} and ladder.skip_from == {}


class _MemoryStore:
    """What sweep and run_items use of a RunStore: finished points, appended rows, run.json's record."""

    def __init__(self, rows=()):
        self.rows_, self.record = list(rows), {}

    def done_points(self, key_fields):
        from ctxeval.runs.rows import point_key

        return {point_key(r, key_fields) for r in self.rows_ if r.get("status") == "ok"}

    def append(self, rows):
        self.rows_.extend(rows)

    def update(self, **fields):
        self.record.update(fields)


@pytest.mark.parametrize("batch_size", [1, 2])
def test_a_sweep_plans_the_pending_cells_in_batches_weighted_by_their_forwards(tok, monkeypatch, batch_size):
    from ctxeval.evals.sweep import WorkItem, forward_cost
    from ctxeval.specs import expand_specs

    cfg = N.NeedleConfig((600, 700), (0.0, 50.0, 100.0), samples=1, scoring="forced", batch_size=batch_size)
    runner_ = N.NeedleRunner(None, tok, "cpu", builder(tok, "passkey"), cfg, "tiny", "passkey")
    specs = expand_specs(["none", "pi:factor=2"])
    finished = [
        {"label": specs[1].label, "length": 600, "depth": runner_.depth((600, 1, 0)), "sample": 0, "status": "ok"},
        {"label": specs[1].label, "length": 700, "depth": runner_.depth((700, 0, 0)), "sample": 0, "status": "oom"},
    ]
    planned = {}
    monkeypatch.setattr(
        N,
        "run_items",
        lambda lm, specs_, items, lengths, store, progress, work: planned.update(items=items, lengths=lengths),
    )
    N.sweep(None, specs, runner_, _MemoryStore(finished))
    pending = {
        0: {600: [(600, 0, 0), (600, 1, 0), (600, 2, 0)], 700: [(700, 0, 0), (700, 1, 0), (700, 2, 0)]},
        1: {600: [(600, 0, 0), (600, 2, 0)], 700: [(700, 0, 0), (700, 1, 0), (700, 2, 0)]},
    }  # 600 depth 50 done
    expected = [
        WorkItem(
            index,
            cells[i : i + batch_size],
            forward_cost(length) * len(cells[i : i + batch_size]),
            length * len(cells[i : i + batch_size]),
            length,
        )
        for index, by_length in pending.items()
        for length, cells in by_length.items()
        for i in range(0, len(cells), batch_size)
    ]
    assert planned["items"] == expected and planned["lengths"] == (600, 700)
    if batch_size == 2:  # written out: a batch of two costs two forwards
        assert planned["items"][0] == WorkItem(0, [(600, 0, 0), (600, 1, 0)], 2 * (600 + 600**2 / 16384), 1200, 600)


@pytest.fixture(scope="module")
def tiny_lm(tiny_model_dir):
    from ctxeval.models.load import load_model

    return load_model(str(tiny_model_dir), device="cpu", dtype="float32")


def test_a_sweep_shares_out_of_memory_lengths_and_halved_batches_across_its_items(tiny_lm, monkeypatch):
    from ctxeval.evals.common import PointOOM
    from ctxeval.specs import expand_specs

    lm = tiny_lm
    hay, _ = H.haystack_tokens(lm.tokenizer, "filler", 4000)
    b = H.PromptBuilder(lm.tokenizer, preset("passkey"), hay, chat_template=False)
    cfg = N.NeedleConfig((600, 700, 800), (50.0,), samples=3, scoring="forced", batch_size=2)
    runner_ = N.NeedleRunner(lm.model, lm.tokenizer, "cpu", b, cfg, "tiny", "passkey")
    calls = []

    def forced(chunk):  # a batch of 2 does not fit at 700; nothing fits at 800
        calls.append((chunk[0].length, len(chunk)))
        if (chunk[0].length, len(chunk)) in ((700, 2), (800, 1), (800, 2)):
            raise PointOOM(f"out of memory at {chunk[0].length}")
        return [{"correct": 1, "answer_nll": 0.0, "response": ""}] * len(chunk)

    monkeypatch.setattr(runner_, "_forced", forced)
    store = _MemoryStore()
    N.sweep(lm, expand_specs(["none"]), runner_, store)
    # work items of 2 + 1 cells per length: the second item of 700 starts at the batch that fitted the first,
    # 800 at 700's batch, and the second item of 800 is skipped, not tried again
    assert calls == [(600, 2), (600, 1), (700, 2), (700, 1), (700, 1), (700, 1), (800, 1)]
    assert [(r["length"], r["sample"], r["status"]) for r in store.rows_] == [
        (600, 0, "ok"),
        (600, 1, "ok"),
        (600, 2, "ok"),
        (700, 0, "ok"),
        (700, 1, "ok"),
        (700, 2, "ok"),
        (800, 0, "oom"),
        (800, 1, "oom"),
        (800, 2, "skipped"),
    ]


def test_a_sweep_generates_under_the_applied_dynamic_rope_frozen_at_each_length(tiny_lm, monkeypatch):
    from ctxeval.rope.patching import RopeHandle
    from ctxeval.specs import expand_specs

    lm = tiny_lm
    hay, _ = H.haystack_tokens(lm.tokenizer, "filler", 4000)
    b = H.PromptBuilder(lm.tokenizer, preset("passkey"), hay, chat_template=False)
    cfg = N.NeedleConfig((200, 300), (50.0,), samples=1, max_new_tokens=2)
    runner_ = N.NeedleRunner(lm.model, lm.tokenizer, "cpu", b, cfg, "tiny", "passkey")
    frozen = []
    real = RopeHandle.freeze_length
    monkeypatch.setattr(
        RopeHandle, "freeze_length", lambda self, n: (frozen.append((self.method.name, n)), real(self, n))[1]
    )
    store = _MemoryStore()
    N.sweep(lm, expand_specs(["dynamic-ntk:factor=2"]), runner_, store)
    assert frozen == [("dynamic-ntk", 200), ("dynamic-ntk", None), ("dynamic-ntk", 300), ("dynamic-ntk", None)]
    assert [(r["length"], r["status"]) for r in store.rows_] == [(200, "ok"), (300, "ok")]


def test_every_row_of_a_measure_has_the_same_fields_and_the_progress_counts_each_prompts_tokens(tok, monkeypatch):
    from ctxeval.evals.common import PointOOM
    from ctxeval.specs import expand_specs

    advanced = []
    progress = type(
        "P", (), {"note": lambda self, t: None, "advance": lambda self, n, text: advanced.append((n, text))}
    )()
    cfg = N.NeedleConfig((600, 700, 800), (0.0, 100.0), samples=1, scoring="forced", batch_size=2)
    runner_ = N.NeedleRunner(None, tok, "cpu", builder(tok, "passkey"), cfg, "tiny", "passkey", progress)

    def forced(chunk):
        if chunk[0].length == 700:
            raise PointOOM("out of memory at 700")
        return [{"correct": int(it.depth == 0), "answer_nll": 0.0, "response": ""} for it in chunk]

    monkeypatch.setattr(runner_, "_forced", forced)
    rows = []
    runner_.measure(expand_specs(["none"])[0], cfg.cells(), rows.extend)
    assert [(r["length"], r["status"], r["correct"]) for r in rows] == [
        (600, "ok", 1),
        (600, "ok", 0),
        (700, "oom", None),
        (700, "oom", None),
        (800, "skipped", None),
        (800, "skipped", None),
    ]
    assert len({tuple(sorted(r)) for r in rows if r["status"] != "ok"}) == 1  # failed and skipped rows: one schema
    # the batch's tokens; which of the length's prompts it held, their depths and how many were right
    assert advanced == [(1200, "none L=600 prompts 1-2/2 (depth 0-100%) 1/2 ok")]
    runner_.cfg = N.NeedleConfig((600,), (100.0, 0.0), samples=1, scoring="forced", batch_size=2)
    runner_.measure(expand_specs(["none"])[0], runner_.cfg.cells(), rows.extend)
    assert advanced[-1] == (1200, "none L=600 prompts 1-2/2 (depth 0-100%) 1/2 ok")
