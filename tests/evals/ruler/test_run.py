"""evals/ruler/run.py: RULER's config, samples read and written, the runner and its rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ctxeval.errors import CtxevalError


def test_ruler_config_refuses_each_bad_field_in_one_line_naming_it():
    from ctxeval.errors import CtxevalError
    from ctxeval.evals.retrieval.suite import SUITE_TASKS
    from ctxeval.evals.ruler.run import RulerConfig
    from ctxeval.evals.ruler.tasks import TASKS

    names = ", ".join([*TASKS, *SUITE_TASKS])
    with pytest.raises(CtxevalError) as exc:
        RulerConfig((), (1024,), 1)
    assert str(exc.value) == f"--tasks names no task; tasks: {names}"
    with pytest.raises(CtxevalError) as exc:
        RulerConfig(("vt", "niah_x", "niah_y"), (1024,), 1)
    assert str(exc.value) == f"unknown task 'niah_x'; tasks: {names}"
    with pytest.raises(CtxevalError) as exc:
        RulerConfig(("vt",), (1024,), 0)
    assert str(exc.value) == "--samples must be >= 1, got 0"
    with pytest.raises(CtxevalError) as exc:
        RulerConfig(("vt",), (), 1)
    assert str(exc.value) == "give at least one --lengths value"
    with pytest.raises(CtxevalError, match="unknown RULER model template 'chatml'"):
        RulerConfig(("vt",), (1024,), 1, template="chatml")
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
    from ctxeval.evals.prompts.sample import RulerSample
    from ctxeval.evals.ruler import run as RE
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
        lambda spec, task, length, samples, emit, handle=None, of=None, ladder=None: measured.append(
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


def test_the_samples_a_run_writes_read_back_as_the_same_prompts(tmp_path):
    """A resumed run reads its prompts back from samples/<length>/<task>/validation.jsonl: every field survives."""
    from ctxeval.evals.prompts.sample import RulerSample
    from ctxeval.evals.ruler.run import read_samples, samples_path, write_samples

    samples = [
        RulerSample(0, "first input", ["a", "b"], 120, " Answer:", 17),
        RulerSample(1, "second input", ["c"], 119, " The code is", None),
    ]
    path = samples_path(tmp_path, "vt", 1024)
    assert path == tmp_path / "1024" / "vt" / "validation.jsonl"
    write_samples(path, samples)
    again = read_samples(path, "vt", 1024)
    assert again == samples and [s.prompt for s in again] == ["first input Answer:", "second input The code is"]


def _samples_file(tmp_path, *lines):
    path = tmp_path / "validation.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_read_samples_fills_rulers_optional_fields_with_their_defaults(tmp_path):
    from ctxeval.evals.ruler.run import read_samples

    path = _samples_file(
        tmp_path,
        json.dumps({"input": "a", "outputs": [7]}),
        json.dumps(
            {
                "index": 99,
                "input": "b",
                "outputs": ["x"],
                "length": 12,
                "answer_prefix": " A:",
                "token_position_answer": 3,
            }
        ),
    )
    first, second = read_samples(path, "vt", 64)
    assert (
        first.index,
        first.input,
        first.outputs,
        first.length,
        first.answer_prefix,
        first.token_position_answer,
    ) == (0, "a", ["7"], -1, "", None)
    assert (second.index, second.length, second.answer_prefix, second.token_position_answer) == (1, 12, " A:", 3)


@pytest.mark.parametrize(
    "lines, message",
    [
        (
            ("[1, 2]",),
            "{path} line 1 is not a RULER sample (not a JSON object); it needs input, outputs and answer_prefix",
        ),
        (
            ('{"input": "a", "outputs": ["x"]}', "{nope"),
            "{path} line 2 is not a RULER sample ({why}); it needs a JSON object with input, outputs and answer_prefix, in "
            "UTF-8",
        ),
        ((), "{path} holds no samples"),
    ],
)
def test_read_samples_refuses_a_line_that_is_not_a_sample_naming_the_line(tmp_path, lines, message):
    from ctxeval.evals.ruler.run import read_samples
    from ctxeval.util.textfiles import read_jsonl

    path = _samples_file(tmp_path, *lines)
    problems = read_jsonl(path, "RULER samples file", objects=False).problems
    why = problems[0][1] if problems else ""
    with pytest.raises(CtxevalError) as err:
        read_samples(path, "vt", 64)
    assert str(err.value) == message.format(path=path, why=why)


def test_read_samples_names_the_missing_file_and_what_writes_it(tmp_path):
    from ctxeval.evals.ruler.run import read_samples

    path = tmp_path / "64" / "vt" / "validation.jsonl"
    with pytest.raises(CtxevalError) as err:
        read_samples(path, "vt", 64)
    assert str(err.value) == (
        f"no RULER samples for vt at length 64: {path} is missing (RULER's prepare.py writes "
        "DIR/<length>/<task>/validation.jsonl)"
    )


class _Progress:
    def __init__(self):
        self.lines, self.notes = [], []

    def advance(self, amount, text):
        self.lines.append((amount, text))

    def note(self, text):
        self.notes.append(text)


def _runner(batch_size, predict):
    from ctxeval.evals.ruler.run import RulerRunner

    runner = RulerRunner(None, None, "cpu", "m", batch_size=batch_size, progress=_Progress())
    runner.predict = predict
    return runner


def _ruler_samples(n, first=0):
    from ctxeval.evals.prompts.sample import RulerSample

    return [RulerSample(first + i, f"prompt {i}", [f"v{i}"], 20, " Answer:") for i in range(n)]


def test_measure_scores_every_sample_once_in_batches_and_counts_them_in_the_progress_line():
    from ctxeval.specs import expand_specs

    seen = []

    def predict(prompts, max_new_tokens, handle, length):
        seen.append(list(prompts))
        return [f" v{p.split()[1].rstrip(' Answer:')}\n" if p.endswith(" Answer:") else "" for p in prompts], [
            11
        ] * len(prompts)

    runner = _runner(2, predict)
    emitted = []
    runner.measure(expand_specs(["none"])[0], "vt", 64, _ruler_samples(3), emitted.append, handle="h")
    assert seen == [["prompt 0 Answer:", "prompt 1 Answer:"], ["prompt 2 Answer:"]]
    assert [[r["sample"] for r in rows] for rows in emitted] == [[0, 1], [2]]
    assert all(
        r["status"] == "ok" and r["prompt_tokens"] == 11 and r["ruler_task"] == "vt" and r["length"] == 64
        for rows in emitted
        for r in rows
    )
    assert [text for _, text in runner.progress.lines] == [
        "none vt L=64 samples 1-2/3 100%",
        "none vt L=64 sample 3/3 100%",
    ]
    assert [amount for amount, _ in runner.progress.lines] == [128, 64]
    runner.progress.lines.clear()
    runner.measure(expand_specs(["none"])[0], "vt", 64, _ruler_samples(1, first=4), lambda rows: None, of=9)
    assert runner.progress.lines[0][1] == "none vt L=64 sample 5/9 100%"
    runner.progress.lines.clear()
    runner.measure(expand_specs(["none"])[0], "vt", 64, _ruler_samples(1, first=4), lambda rows: None)
    assert runner.progress.lines[0][1] == "none vt L=64 sample 5/5 100%"


def test_measure_marks_a_batch_that_runs_out_of_memory_and_stops_that_point():
    from ctxeval.specs import expand_specs

    def predict(prompts, max_new_tokens, handle, length):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2 GiB\nmore")

    runner = _runner(2, predict)
    emitted = []
    runner.measure(expand_specs(["none"])[0], "vt", 64, _ruler_samples(3), emitted.append)
    # the batch of two is halved; a batch of one still runs out of memory: every sample of the point is `oom`
    assert len(emitted) == 1 and [r["sample"] for r in emitted[0]] == [0, 1, 2]
    assert all(r["status"] == "oom" and r["note"] == "CUDA out of memory. Tried to allocate 2 GiB" for r in emitted[0])
    assert runner.progress.notes == [
        "none: out of memory at 64 tokens; batch size 1",
        "none: out of memory at 64 tokens; longer lengths skipped",
    ]
    assert {k: emitted[0][0][k] for k in ("model", "label", "task", "ruler_task", "length", "sample", "value")} == {
        "model": "m",
        "label": "none",
        "task": "ruler",
        "ruler_task": "vt",
        "length": 64,
        "sample": 0,
        "value": None,
    }


def test_measure_rows_hold_the_score_prediction_answers_metric_and_seconds_per_sample(monkeypatch):
    from types import SimpleNamespace

    import ctxeval.evals.ruler.run as E
    from ctxeval.evals.prompts.sample import RulerSample
    from ctxeval.specs import expand_specs

    clock = iter([100.0, 101.23456])
    monkeypatch.setattr(E, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    runner = _runner(2, lambda prompts, max_new_tokens, handle, length: ([" V1 and more\n", "nothing"], [17, 18]))
    samples = [RulerSample(i, f"p{i}", ["v1", "v2"], 20, "") for i in range(2)]
    emitted = []
    runner.measure(expand_specs(["none"])[0], "vt", 64, samples, emitted.append)
    first = emitted[0][0]
    assert {
        k: first[k]
        for k in (
            "model",
            "label",
            "task",
            "ruler_task",
            "length",
            "sample",
            "value",
            "score",
            "prediction",
            "outputs",
            "metric_fn",
            "prompt_tokens",
            "seconds",
            "status",
        )
    } == {
        "model": "m",
        "label": "none",
        "task": "ruler",
        "ruler_task": "vt",
        "length": 64,
        "sample": 0,
        "value": 0.5,
        "score": 0.5,
        "prediction": "V1 and more",
        "outputs": ["v1", "v2"],
        "metric_fn": "string_match_all",
        "prompt_tokens": 17,
        "seconds": 0.617,
        "status": "ok",
    }
    assert emitted[0][1]["score"] == 0.0 and emitted[0][1]["prompt_tokens"] == 18
    runner.measure(expand_specs(["none"])[0], "vt", 64, [], emitted.append)  # nothing to measure: nothing emitted
    assert len(emitted) == 1


def _write_rulers_files(root: Path, task: str, length: int, n: int) -> None:
    path = root / str(length) / task / "validation.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text(
        "".join(
            json.dumps({"index": i, "input": f"{task} {length} {i}", "outputs": ["x"], "answer_prefix": " A:"}) + "\n"
            for i in range(n)
        )
    )


def test_prepare_takes_samples_from_rulers_files_then_from_the_run_then_generates_and_keeps_a_copy(
    tmp_path, monkeypatch
):
    import ctxeval.evals.ruler.run as E
    from ctxeval.evals.prompts.sample import RulerSample

    calls = []

    def fake_generate(task, length, num_samples, tokenizer, sources, seed, model_template, depths, kv_pairs):
        calls.append((task, length, num_samples, tokenizer, sources, seed, model_template))
        return [RulerSample(i, f"gen {task} {length} {i}", ["y"], length, "") for i in range(num_samples)]

    monkeypatch.setattr(E, "generate", fake_generate)
    cfg = E.RulerConfig(("vt", "cwe"), (64, 128), samples=2, seed=7, template="meta-chat")
    given = tmp_path / "ruler"
    _write_rulers_files(given, "vt", 64, 3)
    _write_rulers_files(given, "vt", 128, 1)
    _write_rulers_files(given, "cwe", 64, 2)
    with pytest.raises(CtxevalError, match="no RULER samples for cwe at length 128"):
        E.prepare(cfg, "tok", "src", tmp_path / "run1", samples_from=given)
    _write_rulers_files(given, "cwe", 128, 2)
    out = E.prepare(cfg, "tok", "src", tmp_path / "run1", samples_from=given)
    assert [s.input for s in out[("vt", 64)]] == ["vt 64 0", "vt 64 1"]  # --samples of them
    assert [s.input for s in out[("vt", 128)]] == ["vt 128 0"] and calls == []
    copy = E.read_samples(E.samples_path(tmp_path / "run1" / E.SAMPLES_DIR, "vt", 64), "vt", 64)
    assert copy == out[("vt", 64)]

    told = []
    out = E.prepare(cfg, "tok", "src", tmp_path / "run2", progress=told.append)
    assert calls == [
        ("vt", 64, 2, "tok", "src", 7, "meta-chat"),
        ("vt", 128, 2, "tok", "src", 7, "meta-chat"),
        ("cwe", 64, 2, "tok", "src", 7, "meta-chat"),
        ("cwe", 128, 2, "tok", "src", 7, "meta-chat"),
    ]
    assert told[0] == "generating 2 vt prompts at 64 tokens" and len(told) == 4
    assert out[("cwe", 128)][1].input == "gen cwe 128 1"
    written = tmp_path / "run2" / E.SAMPLES_DIR / "128" / "cwe" / "validation.jsonl"
    assert E.read_samples(written, "cwe", 128) == out[("cwe", 128)]

    calls.clear()
    again = E.prepare(cfg, "tok", "src", tmp_path / "run2", progress=told.append)  # a resume reads its own copy
    assert calls == [] and again == out and len(told) == 4


def test_write_samples_names_the_folder_or_file_it_cannot_write(tmp_path):
    from ctxeval.evals.prompts.sample import RulerSample
    from ctxeval.evals.ruler.run import write_samples

    sample = [RulerSample(0, "a", ["b"], -1, "")]
    (tmp_path / "afile").write_text("x")
    with pytest.raises(CtxevalError, match=r"^cannot create RULER samples folder .*afile/64 \(Not a directory\)"):
        write_samples(tmp_path / "afile" / "64" / "validation.jsonl", sample)
    (tmp_path / "adir").mkdir()
    with pytest.raises(CtxevalError, match=r"^cannot write RULER samples file .*adir: it is a directory"):
        write_samples(tmp_path / "adir", sample)


def test_a_ruler_runner_measures_one_sample_per_batch_silently_by_default():
    from ctxeval.evals.common import SilentProgress
    from ctxeval.evals.ruler.run import RulerRunner
    from ctxeval.specs import expand_specs

    runner = RulerRunner(None, None, "cpu", "m")
    assert runner.batch_size == 1 and isinstance(runner.progress, SilentProgress)
    runner.predict = lambda prompts, max_new_tokens, handle, length: (["x"] * len(prompts), [5] * len(prompts))
    emitted = []
    runner.measure(expand_specs(["none"])[0], "vt", 64, _ruler_samples(2), emitted.append)
    assert [[r["sample"] for r in rows] for rows in emitted] == [[0], [1]]
