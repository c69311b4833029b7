"""`ctxeval tune`: the search space, bad input, rows and winner (recomputed independently), resume (a rerun, SIGKILL),
two processes on one study, reproducibility from the seed, and the export round trip.

Every search runs on the bundled tiny model (trained at 128 tokens, rotary dim 32: 16 pairs) at a 256-token target
(s = 2), so that a trial is one short forward per tuning document. The searches are module fixtures shared by the
tests that read them. Each test names, in its docstring, a one-line bug it catches. The two-process tests are marked
slow (two fresh Python processes): pytest -m slow tests/test_tune.py.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from typer.testing import CliRunner

from ctxeval.cli import app

runner = CliRunner()


TRAINED, TARGET, S = 128, 256, 2.0  # the tiny model's trained length; the target of every search here; the factor


SMALL = ["--target-length", str(TARGET), "--tune-docs", "1", "--heldout-docs", "1"]
SHORT_RANGE = {"short_factor": (1.0, 1.5, False)}  # longrope_run's --space short_factor=1:1.5


# the shared yarn search: 2 tuning documents (a token-weighted mean over more than one), a guard loose enough that
# some trials keep it and some do not (at s = 2 the defaults raise the ppl at 128 by ~20%)
TOLERANCE = 0.2


YARN_ARGS = [
    "--target-length",
    str(TARGET),
    "--tune-docs",
    "2",
    "--heldout-docs",
    "1",
    "--trials",
    "15",
    "--short-tolerance",
    str(TOLERANCE),
    "--seed",
    "0",
]


STUDY = "ctxeval-tune"


def tune(*args):
    return runner.invoke(app, ["tune", *map(str, args)])


def rows_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "rows.jsonl").read_text().splitlines() if line.strip()]


def record_of(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "run.json").read_text())


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{Path(path).resolve()}"


def load_study(url: str):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.load_study(study_name=STUDY, storage=url)


def point_key(params: dict) -> tuple:
    return tuple(sorted((k, round(float(v), 12)) for k, v in params.items()))


def repeated_points(trials: list) -> list[tuple[int, int]]:
    """(first trial, later trial) pairs that measured the same point."""
    seen: dict[tuple, int] = {}
    repeats = []
    for t in trials:
        key = point_key(t.params)
        if key in seen:
            repeats.append((seen[key], t.number))
        seen.setdefault(key, t.number)
    return repeats


def tiny_geometry():
    from ctxeval.rope.methods import Geometry

    return Geometry(32, 100000.0, TRAINED)  # ctxeval/tiny/model/config.json: head_dim 32, rope_theta 1e5, 128


def one_spec(text: str):
    from ctxeval.specs import expand_specs

    return expand_specs([text])[0]


@pytest.fixture(scope="module")
def yarn_run(tmp_path_factory, module_cache):
    base = tmp_path_factory.mktemp("tune-yarn")
    result = tune(*YARN_ARGS, "--out", base / "run", "--export", base / "export")
    assert result.exit_code == 0, result.output
    return SimpleNamespace(dir=base / "run", export=base / "export", result=result)


@pytest.fixture(scope="module")
def longrope_run(tmp_path_factory, module_cache):
    """LongRoPE with a small NSGA-II population, so that later trials are offspring (crossover, mutation)."""
    base = tmp_path_factory.mktemp("tune-longrope")
    result = tune(
        "-m",
        "longrope",
        *SMALL,
        "--trials",
        "14",
        "--population",
        "4",
        "--short-tolerance",
        "0.5",
        "--space",
        "short_factor=1:1.5",
        "--out",
        base / "run",
        "--export",
        base / "export",
    )
    assert result.exit_code == 0, result.output
    return SimpleNamespace(dir=base / "run", export=base / "export", result=result)


@pytest.fixture(scope="module")
def tiny():
    from ctxeval.models.load import load_model

    return load_model("tiny", dtype="float32", device="cpu")


# 3. rows and winner
def _nll(model, ids):
    """Token NLL sum of positions 1.. of `ids` (float64 log-softmax of the logits): independent of ctxeval's chunked
    head."""
    import torch

    x = torch.tensor([ids])
    with torch.no_grad():
        logits = model(x).logits[0, :-1].double()
    return float(-torch.log_softmax(logits, -1).gather(1, x[0, 1:, None]).sum())


def _ppl(lm, docs, length, method=None, params=None):
    """exp(token-weighted NLL) over `docs`: BOS + the first length - 1 tokens of each (the truncate protocol)."""
    from ctxeval.rope.patching import apply_method

    bos = lm.tokenizer.bos_token_id
    total, tokens = 0.0, 0
    if method is None:
        for doc in docs:
            total += _nll(lm.model, [bos] + doc.ids[: length - 1].tolist())
            tokens += length - 1
    else:
        with apply_method(lm.model, method, lm.rope.geometry, **params):
            for doc in docs:
                total += _nll(lm.model, [bos] + doc.ids[: length - 1].tolist())
                tokens += length - 1
    return math.exp(total / tokens)


def test_rows_are_the_finished_trials_and_the_winner_is_the_best_feasible(yarn_run):
    """Bug caught: the winner taken over every trial (ignoring `feasible`), or feasible computed with < / against the
    wrong baseline, or a row written twice (the callback and the end-of-search sync both emitting it)."""
    rows = rows_of(yarn_run.dir)
    record = record_of(yarn_run.dir)["tune"]
    # --trials counts the measured trials; points the method's checks refused are rows too, numbered among them
    assert sorted(r["trial"] for r in rows) == list(range(len(rows)))
    assert sum(r["status"] != "invalid" for r in rows) == 15
    assert all(r["task"] == "tune" and r["phase"] == "search" and r["status"] in ("ok", "invalid") for r in rows)
    ok = [r for r in rows if r["status"] == "ok"]
    assert ok
    baseline = record["baseline_short"]
    for r in ok:
        assert r["value"] == r["ppl_target"] and r["length"] == TARGET and r["short_length"] == TRAINED
        assert r["short_rise"] == pytest.approx(r["ppl_short"] / baseline - 1, rel=1e-12)
        assert r["feasible"] == (r["short_rise"] <= TOLERANCE)
    for r in rows:
        if r["status"] == "invalid":
            assert r["value"] is None
    feasible = [r for r in ok if r["feasible"]]
    assert feasible, "no feasible trial: raise TOLERANCE"
    best = min(feasible, key=lambda r: (r["value"], r["trial"]))
    winner = record["winner"]
    assert winner["trial"] == best["trial"] and winner["ppl_target"] == best["value"]
    assert winner["label"] == best["label"]
    assert (yarn_run.dir / f"heldout-trial-{best['trial']}").is_dir()
    assert record["trials"] == 15 and record["refused"] == len(rows) - 15


def test_an_infeasible_trial_that_beats_every_feasible_one_does_not_win(tmp_path):
    """A random search (its points do not depend on the guard) whose lowest target perplexity broke the guard
    (trial 6: rise 0.237 > 0.2) while trial 0 kept it (0.195): the winner, its held-out run and run.json name the
    best trial that kept it. Bug caught: the winner taken over every trial (test_rows_are_the_finished_trials_and_
    the_winner_is_the_best_feasible's TPE search happens to put a feasible trial first, so it cannot see this)."""
    result = tune(*SMALL, "--trials", "8", "--sampler", "random", "--short-tolerance", "0.2", "--out", tmp_path / "run")
    assert result.exit_code == 0, result.output
    ok = [r for r in rows_of(tmp_path / "run") if r["status"] == "ok"]
    best = min((r for r in ok if r["feasible"]), key=lambda r: (r["value"], r["trial"]))
    assert any(not r["feasible"] and r["value"] < best["value"] for r in ok), "no infeasible trial beats the winner"
    winner = record_of(tmp_path / "run")["tune"]["winner"]
    assert winner["trial"] == best["trial"] and winner["ppl_target"] == best["value"]
    assert [p.name for p in (tmp_path / "run").glob("heldout-trial-*")] == [f"heldout-trial-{best['trial']}"]


def test_the_winner_is_never_a_trial_that_broke_the_guard():
    """best_trial_row on rows where the lowest target perplexity broke the guard, a tie, a failed trial and an
    invalid point. Bug caught: `feasible` ignored (the infeasible trial 1 wins), a tie won by the later trial, or a
    failed trial's row taken as measured."""
    from ctxeval.evals.tune.search import best_trial_row

    rows = [
        {"trial": 0, "status": "ok", "value": 30.0, "feasible": True},
        {"trial": 1, "status": "ok", "value": 20.0, "feasible": False},
        {"trial": 2, "status": "error", "value": 10.0, "feasible": True},
        {"trial": 3, "status": "invalid", "value": None, "feasible": None},
        {"trial": 4, "status": "ok", "value": 25.0, "feasible": True},
        {"trial": 5, "status": "ok", "value": 25.0, "feasible": True},
    ]
    assert best_trial_row(rows)["trial"] == 4
    assert best_trial_row([rows[1], rows[3]]) is None


def test_the_heldout_rows_are_measured_on_the_heldout_documents_alone(yarn_run, tiny):
    """The held-out documents are the corpus's next ones after the tuning ones, disjoint from them, and the held-out
    run's rows were measured on them: its winner row equals the perplexity recomputed on the held-out document. Bugs
    caught: the held-out sweep given the tuning documents (run.json still naming the held-out ids), or a split that
    overlaps the tuning documents by one."""
    from ctxeval.data import corpora

    record = record_of(yarn_run.dir)
    roles = [(d["doc"], d["role"]) for d in record["data"]["documents"]]
    tuning = [doc for doc, role in roles if role == "tuning"]
    heldout = [doc for doc, role in roles if role == "heldout"]
    docs = corpora.select_long_documents("pydoc", tiny.tokenizer, 3, TARGET - 1)
    assert tuning == [d.doc_id for d in docs[:2]] and heldout == [docs[2].doc_id]
    assert not set(tuning) & set(heldout)
    held_dir = yarn_run.dir / record["tune"]["heldout_dir"]
    held_rows = rows_of(held_dir)
    assert held_rows and {r["doc"] for r in held_rows} == set(heldout)
    assert record_of(held_dir)["data"]["documents"] == [{"doc": docs[2].doc_id, "tokens": len(docs[2].ids)}]
    winner = record["tune"]["winner"]
    (row,) = [r for r in held_rows if r["label"] == winner["label"] and r["length"] == TARGET]
    params = {"factor": S, **{k: v for k, v in winner["params"].items() if k != "factor"}}
    assert row["ppl"] == pytest.approx(_ppl(tiny, [docs[2]], TARGET, "yarn", params), rel=1e-5)
    assert row["ppl"] != pytest.approx(_ppl(tiny, docs[:1], TARGET, "yarn", params), rel=1e-3)


def test_invalid_rows_are_invalid_points(yarn_run):
    """Bug caught: a point refused for another reason (an exception in scoring) recorded as 'invalid'."""
    from ctxeval.errors import CtxevalError
    from ctxeval.evals.tune.space import build_space

    space = build_space(one_spec("yarn"), tiny_geometry(), TARGET)
    for r in rows_of(yarn_run.dir):
        if r["status"] == "invalid":
            with pytest.raises(CtxevalError):
                space.spec(r["params"])
        else:
            assert space.spec(r["params"]).label == r["label"]


def test_a_trial_value_is_the_perplexity_recomputed_independently(yarn_run, tiny):
    """The winner's value = exp(token-weighted NLL) at the target on the tuning documents, recomputed here with
    patching.apply_method and a plain forward; its short_rise with plain RoPE's ppl at 128 recomputed too. Bug caught:
    the ppl averaged per document instead of token-weighted, the method applied at the trained length, the baseline
    measured with the method applied, or the objective read from the short length."""
    from ctxeval.data import corpora

    record = record_of(yarn_run.dir)
    tuning_ids = [d["doc"] for d in record["data"]["documents"] if d["role"] == "tuning"]
    assert len(tuning_ids) == 2
    docs = {d.doc_id: d for d in corpora.select_long_documents("pydoc", tiny.tokenizer, 3, TARGET - 1)}
    tuning = [docs[i] for i in tuning_ids]
    rows = {r["trial"]: r for r in rows_of(yarn_run.dir)}
    trial = record["tune"]["winner"]["trial"]
    row = rows[trial]
    params = row["method_params"]
    assert params["factor"] == S and params["beta_slow"] == pytest.approx(
        row["params"]["beta_slow_ratio"] * row["params"]["beta_fast"], rel=1e-3
    )
    assert row["value"] == pytest.approx(_ppl(tiny, tuning, TARGET, "yarn", params), rel=1e-5)
    assert row["ppl_short"] == pytest.approx(_ppl(tiny, tuning, TRAINED, "yarn", params), rel=1e-5)
    baseline = _ppl(tiny, tuning, TRAINED)
    assert record["tune"]["baseline_short"] == pytest.approx(baseline, rel=1e-5)
    assert row["short_rise"] == pytest.approx(row["ppl_short"] / baseline - 1, rel=1e-4, abs=1e-6)


# 4. resume
def test_rerun_reuses_every_trial_and_more_trials_add_only_the_difference(tmp_path, monkeypatch):
    """Bug caught: `have_rows` not filled from rows.jsonl (every trial's row written again by the end-of-search sync),
    or --trials counted as trials to run now instead of finished trials the study should hold."""
    from ctxeval.evals.tune import search as tune_mod

    out = tmp_path / "run"
    args = [*SMALL, "--short-tolerance", "0", "--out", out]
    first = tune(*args, "--trials", "4")
    assert first.exit_code == 0, first.output
    rows = rows_of(out)
    assert sorted(r["trial"] for r in rows) == list(range(len(rows)))
    assert sum(r["status"] != "invalid" for r in rows) == 4  # refused points are rows, not counted trials
    scored = []
    real_score = tune_mod.TrialScorer.score
    monkeypatch.setattr(tune_mod.TrialScorer, "score", lambda self, spec: scored.append(spec) or real_score(self, spec))

    again = tune(*args, "--trials", "4")
    assert again.exit_code == 0, again.output
    assert rows_of(out) == rows
    assert "0 points measured" in again.stderr
    assert record_of(out)["tune"]["measured_now"] == 0
    assert scored == []

    more = tune(*args, "--trials", "6")
    assert more.exit_code == 0, more.output
    after = rows_of(out)
    assert after[: len(rows)] == rows
    assert sorted(r["trial"] for r in after) == list(range(len(after)))
    assert sum(r["status"] != "invalid" for r in after) == 6
    assert len(scored) == sum(r["status"] == "ok" for r in after[len(rows) :])
    assert len(load_study(sqlite_url(out / "study.db")).trials) == len(after)


def _complete_trials(db: Path) -> int:
    """COMPLETE trials in an optuna SQLite file, read with sqlite3 read-only: optuna.load_study here would create the
    schema if the child has not yet, racing the child's own creation of it (see the storage race test below)."""
    import sqlite3

    if not db.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as con:
            return int(con.execute("SELECT COUNT(*) FROM trials WHERE state = 'COMPLETE'").fetchone()[0])
    except sqlite3.Error:  # the tables not created yet, or locked for a moment
        return 0


@pytest.fixture(scope="module", params=["yarn", "longrope"])
def killed_and_resumed(request, tmp_path_factory, module_cache):
    """A search killed with SIGKILL after >= 5 finished trials, then rerun (in this process) with --trials = the
    finished count + 5: YaRN's GP search, and LongRoPE's NSGA-II with its short factors and start tokens (two
    forwards a trial)."""
    base = tmp_path_factory.mktemp("tune-killed")
    longrope = ["--population", "4", "--space", "short_factor=1:1.5"]
    method = ["-m", request.param] + (longrope if request.param == "longrope" else [])
    out = base / "run"
    url = sqlite_url(out / "study.db")
    log = open(base / "killed.log", "w")
    env = {**os.environ, "CTXEVAL_CACHE": str(module_cache)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ctxeval", "tune", *method, *SMALL, "--out", str(out), "--trials", "400"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    deadline = time.time() + 180
    try:
        while True:
            assert proc.poll() is None, (base / "killed.log").read_text()
            assert time.time() < deadline, "no 5 finished trials in 180 s"
            if _complete_trials(out / "study.db") >= 5:
                break
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        log.close()
    study = load_study(url)
    before = {t.number: (t.state.name, dict(t.params)) for t in study.trials}
    asked = counted_trials(study.trials) + 5
    result = tune(*method, *SMALL, "--out", out, "--trials", asked)
    assert result.exit_code == 0, result.output
    return SimpleNamespace(dir=out, url=url, before=before, asked=asked, killed_pid=proc.pid, result=result)


def counted_trials(trials: list) -> int:
    """Finished trials that measured a point: what --trials counts (refused points are PRUNED with an invalid row)."""
    return sum(
        1
        for t in trials
        if t.state.name in ("COMPLETE", "PRUNED") and (t.user_attrs.get("row") or {}).get("status") != "invalid"
    )


def test_sigkill_then_resume_keeps_every_trial_once(killed_and_resumed):
    """Bug caught: recover() not failing the dead process's RUNNING trial (it stays RUNNING, its point never measured
    again), a retry enqueued twice (once per rerun), or a finished trial's row written again on resume."""
    import optuna

    k = killed_and_resumed
    State = optuna.trial.TrialState
    trials = load_study(k.url).trials
    rows = rows_of(k.dir)
    numbers = [r["trial"] for r in rows]
    assert len(numbers) == len(set(numbers)), "a trial number appears twice in rows.jsonl"
    done = [t for t in trials if t.state in (State.COMPLETE, State.PRUNED)]
    assert counted_trials(trials) == k.asked
    assert sorted(numbers) == sorted(t.number for t in done)
    # a trial killed before it drew anything or recorded its process may stay RUNNING (for a minute): no point is lost
    assert not [t.number for t in trials if t.state == State.RUNNING and (t.params or t.user_attrs.get("worker"))]
    by_number = {t.number: t for t in trials}
    killed = [n for n, (state, _) in k.before.items() if state == "RUNNING"]
    assert len(killed) <= 1
    for n in killed:
        if not k.before[n][1] and by_number[n].state == State.RUNNING:
            continue  # killed before its first line (above)
        assert by_number[n].state == State.FAIL
        retries = [t for t in trials if t.user_attrs.get("retry_of") == n]
        if not k.before[n][1]:  # killed before its sampler drew a point: nothing to measure again
            assert retries == []
            continue
        assert len(retries) == 1 and retries[0].number > n, (
            f"killed trial {n} {by_number[n].params} {by_number[n].user_attrs}; trials after: "
            f"{[(t.number, t.state.name, t.params, t.user_attrs.get('retry_of')) for t in trials if t.number > n]}"
        )
        # the point it had drawn, all of it (a trial killed while drawing: the rest drawn anew)
        assert by_number[n].params.items() <= retries[0].params.items()
        assert retries[0].state in (State.COMPLETE, State.PRUNED)
        row = next(r for r in rows if r["trial"] == retries[0].number)
        assert row.get("retry_of") == n
    # the trials finished before the kill are untouched
    for n, (state, params) in k.before.items():
        if state in ("COMPLETE", "PRUNED"):
            assert by_number[n].state.name == state and by_number[n].params == params
    assert record_of(k.dir)["tune"]["trials"] == k.asked


def test_resume_does_not_measure_a_finished_point_again(killed_and_resumed):
    """A resumed search must not spend trials re-measuring points the study already holds (only the killed trial's
    retry repeats a point, by design). Bug caught (found in an earlier version of open_study): the sampler restarts
    from the same --seed, so the resumed process draws the same random start-up points again (trials 1, 2, 3 came
    back as trials 8, 9, 10)."""
    import optuna

    trials = load_study(killed_and_resumed.url).trials
    measured = [t for t in trials if t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)]
    repeats = repeated_points(measured)
    assert not repeats, f"(first trial, repeated by trial) with the same point: {repeats}"


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory, module_cache):
    """Two `ctxeval tune` processes started at once on one --storage, each with its own --out. The storage's tables
    are created first (as a prepared PostgreSQL database would be): the race of two processes creating them is
    test_processes_opening_a_fresh_storage_together_all_get_the_study's, and this fixture tests the sharing."""
    import optuna

    base = tmp_path_factory.mktemp("tune-shared")
    url = sqlite_url(base / "shared.db")
    optuna.storages.RDBStorage(url)  # the schema only: no study
    env = {**os.environ, "CTXEVAL_CACHE": str(module_cache)}
    procs, logs = [], []
    for i in range(2):
        logs.append(open(base / f"w{i}.log", "w"))
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "ctxeval",
                    "tune",
                    *SMALL,
                    "--trials",
                    "30",
                    "--short-tolerance",
                    "0",
                    "--storage",
                    url,
                    "--out",
                    str(base / f"w{i}"),
                ],
                stdout=logs[-1],
                stderr=subprocess.STDOUT,
                env=env,
            )
        )
    try:
        for p in procs:
            p.wait(timeout=300)
    finally:
        for p, log in zip(procs, logs):
            if p.poll() is None:
                p.kill()
                p.wait()
            log.close()
    return SimpleNamespace(
        base=base,
        url=url,
        procs=procs,
        dirs=[base / "w0", base / "w1"],
        logs=[(base / f"w{i}.log").read_text() for i in range(2)],
    )


@pytest.mark.slow  # two fresh Python processes at once: ~25 s on 2 CPUs (pytest -m slow tests/evals/tune/test_job.py)
def test_two_processes_share_a_study_without_measuring_a_trial_twice(two_processes):
    """Both processes work on one study until it holds 30 finished trials; each trial is measured by exactly one
    process (user_attrs 'worker'), each rows.jsonl holds a trial at most once, and a trial in both files is the same
    row (copied from the storage by the end-of-search sync, not measured again). Bug caught: a process stopping at
    its own 30 trials (60 in all), or the sync writing rows it already has."""
    import optuna

    tp = two_processes
    for p, log in zip(tp.procs, tp.logs):
        assert p.returncode == 0, log[-1500:]
    State = optuna.trial.TrialState
    trials = load_study(tp.url).trials
    done = [t for t in trials if t.state in (State.COMPLETE, State.PRUNED)]
    # each process stops when the study holds 30 measured trials: at most one trial in flight elsewhere
    assert 30 <= counted_trials(trials) <= 32
    pids = {p.pid for p in tp.procs}
    rows_by_dir = [rows_of(d) for d in tp.dirs]
    for rows in rows_by_dir:
        numbers = [r["trial"] for r in rows]
        assert len(numbers) == len(set(numbers))
    union: dict[int, dict] = {}
    for rows in rows_by_dir:
        for r in rows:
            r = {k: v for k, v in r.items() if k != "synced"}  # the mark of a row copied from the study
            if r["trial"] in union:
                assert r == union[r["trial"]], f"trial {r['trial']} has two different rows"
            union[r["trial"]] = r
    for t in done:
        assert t.number in union
        assert {k: v for k, v in union[t.number].items() if k != "retry_of"} == t.user_attrs["row"]
    for pid, d in zip([p.pid for p in tp.procs], tp.dirs):
        mine = [t for t in trials if (t.user_attrs.get("worker") or {}).get("pid") == pid and t.state == State.COMPLETE]
        assert len(mine) == record_of(d)["tune"]["measured_now"]
    assert all((t.user_attrs.get("worker") or {}).get("pid") in pids for t in done)


@pytest.mark.slow  # shares the two-process fixture above
def test_two_processes_measure_each_point_once(two_processes):
    """The point of a second process is to measure other points. Bug caught (found in an earlier version of
    open_study): both processes build the same sampler from --seed 0 and enqueue the seed points into the empty study,
    so the second process measures the first one's points again (trials 0 and 1 both the defaults, then each random
    start-up point twice)."""
    import optuna

    State = optuna.trial.TrialState
    for p, log in zip(two_processes.procs, two_processes.logs):
        assert p.returncode == 0, log[-1500:]
    measured = [t for t in load_study(two_processes.url).trials if t.state in (State.COMPLETE, State.PRUNED)]
    workers = {(t.user_attrs.get("worker") or {}).get("pid") for t in measured}
    assert workers == {p.pid for p in two_processes.procs}, "one process measured nothing: the test says nothing"
    repeats = repeated_points(measured)
    assert not repeats, f"(first trial, repeated by trial) with the same point: {repeats}"


@pytest.mark.slow  # shares the two-process fixture above
def test_each_process_reports_the_trials_it_measured(two_processes):
    """The closing line 'done in ...: N points measured' of each process counts its own measurements. Bug caught
    (present): rows the end-of-search sync copies from the storage (the other process's trials) are new lines in
    rows.jsonl, so cli/run.py's tally counts them as measured by this command (each process claims ~all trials)."""
    import re

    import optuna

    trials = load_study(two_processes.url).trials
    for p, log in zip(two_processes.procs, two_processes.logs):
        assert p.returncode == 0, log[-1500:]
        mine = sum(
            t.state == optuna.trial.TrialState.COMPLETE and (t.user_attrs.get("worker") or {}).get("pid") == p.pid
            for t in trials
        )
        claimed = int(re.search(r"done in [^:]*: (\d+) points? measured", log).group(1))
        assert claimed == mine, f"process {p.pid} measured {mine} trials and reports {claimed}"


# 6. reproducible from the seed
def _trials(run_dir):
    return [
        (r["trial"], r["status"], r["params"], r.get("value"))
        for r in sorted(rows_of(run_dir), key=lambda r: r["trial"])
    ]


def test_the_same_seed_gives_the_same_trials_and_another_seed_others(yarn_run, tmp_path):
    """Bug caught: the sampler built without seed=cfg.seed (random each run), or --seed not passed to TuneConfig."""
    again = tune(*YARN_ARGS, "--out", tmp_path / "again")
    assert again.exit_code == 0, again.output
    assert _trials(tmp_path / "again") == _trials(yarn_run.dir)
    # the start-up trials are the sampler's random draws: the documents and the guard do not change them
    other = tune(*SMALL, "--trials", "6", "--short-tolerance", "0", "--seed", "1", "--out", tmp_path / "other")
    assert other.exit_code == 0, other.output
    first = {t: point_key(p) for t, _, p, _ in _trials(yarn_run.dir)}
    second = {t: point_key(p) for t, _, p, _ in _trials(tmp_path / "other")}
    # trials 0 and 1 are the method's defaults and its betas moved to the model's geometry, enqueued whatever the seed
    assert second[0] == first[0] and second[1] == first[1]
    assert all(second[t] != first[t] for t in range(2, 6))


# 7. export
def test_yarn_export_round_trip(yarn_run, tiny):
    """config.json holds the winner; the run's own verification passed; and here, independently, the exported
    directory loaded fresh gives the logits of the tiny model with the winner applied by ctxeval. Bug caught:
    the default attention factor exported instead of the searched one, max_position_embeddings left at 128, or
    beta_fast and beta_slow swapped."""
    import torch
    from transformers import AutoConfig

    from ctxeval.models.load import load_model
    from ctxeval.rope.patching import apply_method

    tune_record = record_of(yarn_run.dir)["tune"]
    winner = tune_record["winner"]
    config = AutoConfig.from_pretrained(yarn_run.export)
    rope = config.rope_parameters
    assert rope["rope_type"] == "yarn"
    for key in ("beta_fast", "beta_slow", "attention_factor", "factor"):
        assert rope[key] == winner["params"][key], key
    assert rope["original_max_position_embeddings"] == TRAINED and rope["rope_theta"] == 100000.0
    assert config.max_position_embeddings == TARGET
    assert (yarn_run.export / "model.safetensors").is_symlink()
    legacy = json.loads((yarn_run.export / "rope_scaling.json").read_text())
    assert legacy["rope_scaling"]["type"] == "yarn"
    assert legacy["rope_scaling"]["beta_fast"] == winner["params"]["beta_fast"]
    check = tune_record["export"]["verification"]
    assert check["passed"] is True and check["max_rel_diff_ppl"] <= 1e-6 and check["max_rel_diff_rope"] <= 1e-6

    fresh = load_model(str(yarn_run.export), dtype="float32", device="cpu")
    ids = torch.randint(3, len(tiny.tokenizer), (1, 1024), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = fresh.model(ids).logits
        with apply_method(tiny.model, "yarn", tiny.rope.geometry, **winner["params"]):
            want = tiny.model(ids).logits
        plain = tiny.model(ids).logits
    assert float((got - want).abs().max() / want.abs().max()) <= 1e-5
    assert float((plain - want).abs().max() / want.abs().max()) > 1e-3  # the winner changes the logits at 1k


def test_longrope_export_round_trip(longrope_run, tiny):
    """Bug caught: long_factor exported before the running max (as the raw point), the short factors exported as the
    long ones, or longrope-factors.json not written."""
    import torch
    from transformers import AutoConfig

    from ctxeval.models.load import load_model
    from ctxeval.rope.patching import apply_method

    tune_record = record_of(longrope_run.dir)["tune"]
    winner = tune_record["winner"]
    rope = AutoConfig.from_pretrained(longrope_run.export).rope_parameters
    assert rope["rope_type"] == "longrope"
    long = rope["long_factor"]
    assert len(long) == 16 and all(b >= a for a, b in zip(long, long[1:]))
    assert long == winner["params"]["long_factor"]
    short = rope["short_factor"]  # searched too: the factors transformers uses up to the trained length
    assert short == winner["params"]["short_factor"] and short != long
    assert len(short) == 16 and all(b >= a for a, b in zip(short, short[1:]))
    assert all(1.0 <= f <= 1.0 + S for f in long + short)
    assert "start_token_idx" not in winner["params"]  # not searched for --export: no config holds it
    factors = json.loads((longrope_run.export / "longrope-factors.json").read_text())
    assert factors["long_factor"] == long and factors["short_factor"] == short
    assert factors["original_max_position_embeddings"] == TRAINED
    assert tune_record["export"]["verification"]["passed"] is True

    fresh = load_model(str(longrope_run.export), dtype="float32", device="cpu")
    ids = torch.randint(3, len(tiny.tokenizer), (1, 1024), generator=torch.Generator().manual_seed(1))
    params = {k: tuple(v) if isinstance(v, list) else v for k, v in winner["params"].items()}
    with torch.no_grad():
        for length in (TRAINED, 1024):  # the short factors, then the long ones
            got = fresh.model(ids[:, :length]).logits
            with apply_method(tiny.model, "longrope", tiny.rope.geometry, **params):
                want = tiny.model(ids[:, :length]).logits
            assert float((got - want).abs().max() / want.abs().max()) <= 1e-5, length


def test_every_longrope_trial_measures_the_trained_length_with_its_own_short_rope(longrope_run, tiny):
    """Each trial's ppl_short is its own short factors' and attention factor's, recomputed here with a plain forward.
    Bug caught: the short factors' forward skipped (the first L positions of the long forward taken instead, which
    uses the long factors), or a cached short forward reused for another RoPE."""
    from ctxeval.data import corpora
    from ctxeval.evals.tune.space import build_space

    record = record_of(longrope_run.dir)
    (tuning_id,) = [d["doc"] for d in record["data"]["documents"] if d["role"] == "tuning"]
    docs = {d.doc_id: d for d in corpora.select_long_documents("pydoc", tiny.tokenizer, 2, TARGET - 1)}
    space = build_space(one_spec("longrope"), tiny_geometry(), TARGET, False, SHORT_RANGE, start_tokens=False)
    by_factor = {}
    for r in sorted(rows_of(longrope_run.dir), key=lambda r: r["trial"]):
        by_factor.setdefault(round(r["params"]["attention_factor"], 9), r)
    assert len(by_factor) >= 3, "the search tried too few attention factors"
    shorts = set()
    for r in by_factor.values():
        params = space.spec(r["params"]).params
        assert r["ppl_short"] == pytest.approx(_ppl(tiny, [docs[tuning_id]], TRAINED, "longrope", params), rel=1e-5)
        shorts.add(round(r["ppl_short"], 6))
    assert len(shorts) == len(by_factor)


# 8. LongRoPE search
def test_longrope_trials_are_on_the_grid_and_monotone(longrope_run):
    """Every trial's long factors are on the 0.01 grid in [1, 1 + s], the method its label names has non-decreasing
    long factors, and the first trials are the PI / NTK / YaRN seeds. Bug caught: snap skipped for the trials
    NSGA-II breeds (crossover gives off-grid values), or spec() without the running max."""
    from ctxeval.evals.tune.space import build_space, longrope_seeds
    from ctxeval.specs import format_param

    space = build_space(one_spec("longrope"), tiny_geometry(), TARGET, False, SHORT_RANGE, start_tokens=False)
    rows = sorted(rows_of(longrope_run.dir), key=lambda r: r["trial"])
    assert [r["trial"] for r in rows] == list(range(14))
    assert all(r["status"] == "ok" for r in rows)
    for r in rows:
        factors = [r["params"][f"{name}.{i}"] for name in ("long_factor", "short_factor") for i in range(16)]
        assert all(abs(f * 100 - round(f * 100)) < 1e-9 and 1.0 <= f <= 1.0 + S for f in factors), factors
        spec = space.spec(r["params"])
        assert spec.label == r["label"]
        long = spec.params["long_factor"]
        assert all(b >= a for a, b in zip(long, long[1:]))
        assert f"long_factor={format_param(long)}" in r["label"]
    study = load_study(sqlite_url(longrope_run.dir / "study.db"))
    seeds = {t.user_attrs.get("seed"): t.number for t in study.trials if t.user_attrs.get("seed")}
    assert set(seeds) == {"pi", "ntk", "yarn"}
    want = longrope_seeds(space, tiny_geometry())
    for name, number in seeds.items():
        got = space.spec(rows[number]["params"]).params
        np.testing.assert_allclose(got["long_factor"], want[name], atol=0.005 + 1e-12)
        assert got["short_factor"] == (1.0,) * 16  # every seed is plain RoPE up to the trained length


# a study made for another protocol
def test_another_method_in_the_same_run_directory_is_refused(yarn_run, tmp_path):
    """Bug caught: the spec record without the method (a yarn run directory resumed as an ntk search)."""
    out = tmp_path / "run"
    shutil.copytree(yarn_run.dir, out)
    before = (out / "rows.jsonl").read_text()
    result = tune(*YARN_ARGS, "-m", "ntk", "--out", out)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.stderr
    assert "method" in lines[0] and "--overwrite" in lines[0]
    assert (out / "rows.jsonl").read_text() == before


def test_a_shared_study_made_for_another_target_is_refused(yarn_run, tmp_path):
    """--storage of a yarn/256 study with --target-length 512: refused, naming what differs, and the advice given
    works. Bug caught: `target` left out of the protocol (a 512 search would continue the 256 study). Bug caught
    (present): the message advises '--overwrite', which only replaces the run directory: the study lives in --storage,
    so the same error comes back."""
    shared = tmp_path / "shared.db"
    shutil.copyfile(yarn_run.dir / "study.db", shared)
    url = sqlite_url(shared)
    held = len(load_study(url).trials)
    args = [*[a if a != str(TARGET) else "512" for a in YARN_ARGS], "--storage", url]
    result = tune(*args, "--out", tmp_path / "other")
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith("error:") and "another search" in message and "target" in message, result.stderr
    assert len(load_study(url).trials) == held  # nothing added to the study
    if "--overwrite" in message:
        again = tune(*args, "--trials", "2", "--out", tmp_path / "other", "--overwrite")
        assert again.exit_code == 0, f"the advised --overwrite does not help: {again.stderr.strip().splitlines()[-1]}"


def test_the_short_forward_is_reused_only_for_the_same_rope_up_to_the_trained_length(tiny):
    """TrialScorer.short_key decides when a LongRoPE trial reuses an earlier forward at the trained length. Bug
    caught: any of the attention factor, the short factors or the start tokens left out of the key (the trial
    inherits another RoPE's perplexity at L: the guard, the winner and the export follow it)."""
    from ctxeval.evals.tune.scoring import TrialScorer, TuneConfig
    from ctxeval.specs import MethodSpec

    scorer = TrialScorer(tiny, [], TuneConfig(TARGET, TRAINED))
    base = {"short_factor": (1.0,) * 16, "long_factor": (1.5,) * 16, "factor": S}

    def key(**changed):
        return scorer.short_key(MethodSpec("longrope", {**base, **changed}))

    assert key() == key(long_factor=(2.0,) * 16)  # the long factors change nothing up to L
    assert key() != key(attention_factor=1.3)
    assert key() != key(short_factor=(1.0,) * 15 + (1.1,))
    assert key() != key(start_token_idx=4)
    assert key(start_token_idx=0) == key()
