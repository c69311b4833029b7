"""The one out-of-memory rule of ppl, needle, passkey and RULER (evals.common.OomLadder): a batch that runs out of
memory is halved; when a batch of one still does, the point is recorded as `oom` and the method's points at that
length and longer are skipped. Each task is run here with an injected out-of-memory."""

import numpy as np
import pytest
from helpers import tiny_llama

from ctxeval.data.corpora import TokenDoc
from ctxeval.evals import perplexity as P
from ctxeval.evals.common import OomLadder, PointOOM
from ctxeval.evals.prompts.sample import RulerSample
from ctxeval.evals.ruler.run import RulerRunner
from ctxeval.specs import expand_specs


class _Notes:
    def __init__(self):
        self.notes, self.lines = [], []

    def note(self, text):
        self.notes.append(text)

    def advance(self, amount, text):
        self.lines.append((amount, text))

    def start(self, total):
        pass


def test_the_ladder_halves_a_batch_down_to_one_and_then_lets_the_out_of_memory_through():
    ladder, notes = OomLadder(), _Notes()
    tried = []

    def measure(chunk):
        tried.append(list(chunk))
        if len(chunk) > 1:
            raise PointOOM("out of memory")
        return [x * 10 for x in chunk]

    got = list(ladder.batches("none", 600, [1, 2, 3], 4, notes, measure))
    assert got == [([1], [10]), ([2], [20]), ([3], [30])]
    assert tried == [[1, 2, 3], [1, 2], [1], [2], [3]]
    assert notes.notes == [
        "none: out of memory at 600 tokens; batch size 2",
        "none: out of memory at 600 tokens; batch size 1",
    ]
    assert ladder.fitted == {("none", 600): 1} and ladder.skip_from == {}
    # a longer length of the method starts at the batch that fitted; a shorter one and another method do not
    assert (
        ladder.first_batch("none", 700, 4),
        ladder.first_batch("none", 500, 4),
        ladder.first_batch("pi", 700, 4),
    ) == (1, 4, 4)

    def never(chunk):
        raise PointOOM("out of memory")

    with pytest.raises(PointOOM):
        list(ladder.batches("none", 800, [1, 2], 4, notes, never))
    ladder.give_up("none", 800, notes)
    assert notes.notes[-1] == "none: out of memory at 800 tokens; longer lengths skipped"
    assert [ladder.skipped_at("none", n) for n in (700, 800, 900)] == [None, 800, 800]
    assert ladder.skipped_at("pi", 900) is None and ladder.skip_note("none") == "skipped: out of memory at 800 tokens"


def test_the_ladder_trims_a_batch_to_one_shape_and_keeps_the_order():
    words = ["aa", "bb", "c", "dd"]
    got = list(
        OomLadder().batches(
            "none",
            8,
            words,
            3,
            _Notes(),
            lambda chunk: len(chunk),
            lambda c: c[:1] if len(c[0]) == 1 else [w for w in c if len(w) == 2][:2],
        )
    )
    assert got == [(["aa", "bb"], 2), (["c"], 1), (["dd"], 1)]


# -- ppl


def _ppl_runner(cfg, fails):
    """A PplRunner over the tiny Llama whose forwards of the sequences `fails(seqs)` names run out of memory."""
    notes = _Notes()
    runner = P.PplRunner(tiny_llama(), "cpu", cfg, 1, "tiny", notes)
    real, sizes = runner._nll_batch, []

    def nll_batch(seqs, finite=True):
        sizes.append((len(seqs), len(seqs[0])))
        if fails(seqs):
            raise PointOOM("out of memory (injected)")
        return real(seqs, finite)

    runner._nll_batch = nll_batch
    return runner, notes, sizes


def test_ppl_records_the_length_that_runs_out_of_memory_and_skips_the_longer_ones_of_every_document():
    runner, notes, _ = _ppl_runner(P.PplConfig((32, 64, 96, 128)), lambda seqs: len(seqs[0]) >= 96)
    ladder, rows = OomLadder(), []
    spec = expand_specs(["none"])[0]
    docs = [TokenDoc(f"d{i}", np.random.default_rng(i).integers(2, 128, 400)) for i in range(2)]
    for doc in docs:  # as a sweep measures them: one ladder for the run
        runner.measure(spec, doc, [32, 64, 96, 128], rows.extend, ladder)
    assert [(r["doc"], r["length"], r["status"], r.get("note")) for r in rows] == [
        ("d0", 32, "ok", None),
        ("d0", 64, "ok", None),
        ("d0", 96, "oom", "out of memory (injected)"),
        ("d0", 128, "skipped", "skipped: out of memory at 96 tokens"),
        ("d1", 96, "skipped", "skipped: out of memory at 96 tokens"),
        ("d1", 128, "skipped", "skipped: out of memory at 96 tokens"),
        ("d1", 32, "ok", None),
        ("d1", 64, "ok", None),
    ]
    assert notes.notes == [
        "none: out of memory at 128 tokens; measuring length by length",
        "none: out of memory at 96 tokens; longer lengths skipped",
    ]
    assert ladder.skip_from == {"none": 96}


def test_ppl_sliding_windows_start_the_next_document_at_the_batch_that_fitted():
    cfg = P.PplConfig((64,), "sliding", stride=16, batch_size=4)
    runner, notes, sizes = _ppl_runner(cfg, lambda seqs: len(seqs) > 1)
    ladder, rows = OomLadder(), []
    spec = expand_specs(["none"])[0]
    for i in range(2):
        runner.measure(
            spec, TokenDoc(f"d{i}", np.random.default_rng(i).integers(2, 128, 160)), [64], rows.extend, ladder
        )
    first = sizes.index((1, 64))
    assert [n for n, _ in sizes[:first]] == [4, 2] and {n for n, _ in sizes[first:]} == {1}
    assert [r["status"] for r in rows] == ["ok", "ok"] and ladder.fitted == {("none", 64): 1}
    assert notes.notes == [
        "none: out of memory at 64 tokens; batch size 2",
        "none: out of memory at 64 tokens; batch size 1",
    ]


def test_ppl_documents_that_share_forwards_are_halved_and_the_next_batch_starts_halved():
    cfg = P.PplConfig((32, 64), batch_size=4)
    runner, notes, sizes = _ppl_runner(cfg, lambda seqs: len(seqs) > 2)
    ladder, rows = OomLadder(), []
    spec = expand_specs(["none"])[0]
    docs = [TokenDoc(f"d{i}", np.random.default_rng(i).integers(2, 128, 200)) for i in range(8)]
    runner.measure_docs(spec, docs[:4], [32, 64], rows.extend, ladder)
    runner.measure_docs(spec, docs[4:], [32, 64], rows.extend, ladder)
    assert [n for n, _ in sizes] == [4, 2, 2, 2, 2]  # the second batch of four is not tried whole again
    assert len(rows) == 16 and all(r["status"] == "ok" for r in rows)
    assert notes.notes == ["none: out of memory at 64 tokens; batch size 2"]


# -- RULER


def _ruler_runner(fails):
    """A RulerRunner whose predict runs out of memory where `fails(length, batch)` says so."""
    runner = RulerRunner(None, None, "cpu", "m", batch_size=2, progress=_Notes())
    calls = []

    def predict(prompts, max_new_tokens, handle, length):
        calls.append((length, len(prompts)))
        if fails(length, len(prompts)):
            raise RuntimeError("CUDA out of memory. Tried to allocate 2 GiB")
        return ["x"] * len(prompts), [length] * len(prompts)

    runner.predict = predict
    return runner, calls


def _samples(n):
    return [RulerSample(i, f"prompt {i}", ["x"], 20, "") for i in range(n)]


def test_ruler_halves_the_batch_then_records_oom_and_skips_that_length_and_longer_ones_of_every_task():
    runner, calls = _ruler_runner(lambda length, batch: length == 128 and batch > 1 or length == 256)
    ladder, rows = OomLadder(), []
    spec = expand_specs(["none"])[0]
    for task, length in [("vt", 64), ("qa_1", 64), ("vt", 128), ("qa_1", 128), ("vt", 256), ("qa_1", 256), ("vt", 512)]:
        runner.measure(spec, task, length, _samples(3), rows.extend, ladder=ladder)
    assert calls == [(64, 2), (64, 1), (64, 2), (64, 1), (128, 2), (128, 1), (128, 1), (128, 1)] + [(128, 1)] * 3 + [
        (256, 1)
    ]
    status: dict[tuple[str, int], list[str]] = {}
    for r in rows:
        status.setdefault((r["ruler_task"], r["length"]), []).append(r["status"])
    assert status == {
        ("vt", 64): ["ok"] * 3,
        ("qa_1", 64): ["ok"] * 3,
        ("vt", 128): ["ok"] * 3,
        ("qa_1", 128): ["ok"] * 3,
        ("vt", 256): ["oom"] * 3,
        ("qa_1", 256): ["skipped"] * 3,
        ("vt", 512): ["skipped"] * 3,
    }
    skipped = [r for r in rows if r["status"] == "skipped"]
    assert {r["note"] for r in skipped} == {"skipped: out of memory at 256 tokens"}
    assert all(r["value"] is None and r["task"] == "ruler" and r["label"] == "none" for r in skipped)
    assert runner.progress.notes == [
        "none: out of memory at 128 tokens; batch size 1",
        "none: out of memory at 256 tokens; longer lengths skipped",
    ]


class _MemoryStore:
    """What a sweep uses of a RunStore: finished points, appended rows, run.json's record."""

    def __init__(self):
        self.rows_, self.record = [], {}

    def done_points(self, key_fields):
        return set()

    def append(self, rows):
        self.rows_.extend(rows)

    def update(self, **fields):
        self.record.update(fields)


def test_a_ruler_sweep_carries_one_ladder_across_its_work_items(tiny_model_dir):
    from ctxeval.evals.ruler.run import RulerConfig, sweep
    from ctxeval.models.load import load_model

    lm = load_model(str(tiny_model_dir), device="cpu", dtype="float32")
    runner = RulerRunner(lm.model, lm.tokenizer, "cpu", "tiny", batch_size=1, progress=_Notes())
    runner.predict = lambda prompts, max_new_tokens, handle, length: (
        (_ for _ in ()).throw(PointOOM("out of memory (injected)"))
        if length == 128
        else (["x"] * len(prompts), [length] * len(prompts))
    )
    cfg = RulerConfig(("vt", "qa_1"), (64, 128, 256), 2)
    prompts = {(task, length): _samples(2) for task in cfg.tasks for length in cfg.lengths}
    store = _MemoryStore()
    sweep(lm, expand_specs(["none"]), prompts, cfg, runner, store)
    got = [(r["length"], r["ruler_task"], r["status"]) for r in store.rows_]
    assert got == [
        (64, "vt", "ok"),
        (64, "vt", "ok"),
        (64, "qa_1", "ok"),
        (64, "qa_1", "ok"),
        (128, "vt", "oom"),
        (128, "vt", "skipped"),  # the next work item (batch size 1): not tried again
        (128, "qa_1", "skipped"),
        (128, "qa_1", "skipped"),
        (256, "vt", "skipped"),
        (256, "vt", "skipped"),
        (256, "qa_1", "skipped"),
        (256, "qa_1", "skipped"),
    ]
