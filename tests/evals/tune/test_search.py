"""evals/tune/search.py: a study shared by processes, recovery of dead trials, queued seeds."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

TRAINED, TARGET, S = 128, 256, 2.0  # the tiny model's trained length; the target of every search here; the factor


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{Path(path).resolve()}"


def tiny_geometry():
    from ctxeval.rope.methods import Geometry

    return Geometry(32, 100000.0, TRAINED)  # ctxeval/tiny/model/config.json: head_dim 32, rope_theta 1e5, 128


def one_spec(text: str):
    from ctxeval.specs import expand_specs

    return expand_specs([text])[0]


@pytest.fixture(scope="module")
def tiny():
    from ctxeval.models.load import load_model

    return load_model("tiny", dtype="float32", device="cpu")


def test_processes_opening_a_fresh_storage_together_all_get_the_study(tmp_path):
    """Several processes (or machines) started at once on one new storage: each must open the study. Bug caught
    (present): open_study creates optuna's RDBStorage without handling the schema-creation race, so all but one fail
    with '--storage ...: cannot open it (UNIQUE constraint failed: alembic_version.version_num / table studies already
    exists)'. Threads here: the same race as processes, deterministic enough and fast."""
    import optuna

    from ctxeval.errors import CtxevalError
    from ctxeval.evals.tune.search import TuneConfig, open_study
    from ctxeval.evals.tune.space import build_space

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    cfg, space = TuneConfig(TARGET, TRAINED, trials=4), build_space(one_spec("yarn"), tiny_geometry(), TARGET)
    failures = []
    for attempt in range(3):
        url = sqlite_url(tmp_path / f"fresh-{attempt}.db")
        barrier = threading.Barrier(4)
        outcomes = []

        def work(barrier=barrier, url=url, outcomes=outcomes):
            barrier.wait()
            try:
                open_study(url, {"model": "tiny", "target": TARGET}, cfg, space, tiny_geometry())
                outcomes.append("ok")
            except CtxevalError as exc:
                outcomes.append(str(exc)[:160])

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        failures += [o for o in outcomes if o != "ok"]
    assert not failures, failures


def test_recover_fails_dead_and_orphaned_trials_and_retries_only_drawn_points(tmp_path, monkeypatch):
    """recover(): a RUNNING trial of a dead process here is failed and retried with its point; one without a worker
    or a point is failed once it is old (ORPHAN_SECONDS), with no retry; a live process's trial is left alone. Bug
    caught: a retry enqueued for a trial with no point (an empty enqueued trial), the orphan rule failing a live
    process's trial, or `dead_here` ignoring the host."""
    import optuna

    from ctxeval.evals.tune import search as tune_mod

    storage = optuna.storages.RDBStorage(sqlite_url(tmp_path / "s.db"))
    study = optuna.create_study(study_name="x", storage=storage)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = study.ask()
    live.suggest_float("a", 0, 1)
    live.set_user_attr("worker", {"host": tune_mod.WORKER["host"], "pid": os.getppid()})
    killed = study.ask()
    killed.suggest_float("a", 0, 1)
    killed.set_user_attr("worker", {"host": tune_mod.WORKER["host"], "pid": dead.pid})
    elsewhere = study.ask()
    elsewhere.suggest_float("a", 0, 1)
    elsewhere.set_user_attr("worker", {"host": "another-machine", "pid": dead.pid})
    orphan = study.ask()
    monkeypatch.setattr(tune_mod, "ORPHAN_SECONDS", -1)
    assert tune_mod.recover(study, storage) == [killed.number]
    states = {t.number: t.state.name for t in study.get_trials()}
    assert states[live.number] == "RUNNING" and states[elsewhere.number] == "RUNNING"
    assert states[killed.number] == "FAIL" and states[orphan.number] == "FAIL"
    waiting = [t for t in study.get_trials() if t.state.name == "WAITING"]
    enqueued = [(t.system_attrs["fixed_params"], t.user_attrs["retry_of"]) for t in waiting]  # a WAITING trial's point
    assert enqueued == [(killed.params, killed.number)]
    assert tune_mod.recover(study, storage) == []  # a retry is enqueued once


def test_a_failed_retry_is_not_retried_again(tmp_path):
    """Bug caught: recover() queuing a retry for a failed retry, so a point that kills its process (out of memory) is
    measured first on every resume and the search never gets past it."""
    import optuna

    from ctxeval.evals.tune import search as tune_mod

    storage = optuna.storages.RDBStorage(sqlite_url(tmp_path / "s.db"))
    study = optuna.create_study(study_name="x", storage=storage)
    first = study.ask()
    first.suggest_float("a", 0, 1)
    study.tell(first, state=optuna.trial.TrialState.FAIL)
    assert tune_mod.recover(study, storage) == [first.number]
    retry = study.ask()  # takes the queued point
    retry.suggest_float("a", 0, 1)
    assert retry.params == first.params and retry.user_attrs["retry_of"] == first.number
    study.tell(retry, state=optuna.trial.TrialState.FAIL)
    assert tune_mod.recover(study, storage) == []
    assert not [t for t in study.get_trials() if t.state.name == "WAITING"]


def test_seed_points_are_queued_with_the_study(tmp_path):
    """The creator queues the defaults when it creates the study (before any forward), a process that joins queues
    nothing. Bug caught: seeds queued after the baseline forward (an interruption there leaves a study without them),
    or by every process that opens the study."""
    from ctxeval.evals.tune.search import TuneConfig, open_study
    from ctxeval.evals.tune.space import build_space

    space = build_space(one_spec("yarn"), tiny_geometry(), 1024)
    cfg = TuneConfig(1024, 128, trials=5)
    url = sqlite_url(tmp_path / "s.db")
    opened = open_study(url, {"p": 1}, cfg, space, tiny_geometry())
    waiting = [t for t in opened.study.get_trials() if t.state.name == "WAITING"]
    assert opened.created and [t.user_attrs["seed"] for t in waiting] == ["defaults", "geometry"]
    assert waiting[0].system_attrs["fixed_params"] == {
        "beta_fast": 32.0,
        "beta_slow_ratio": 0.03125,
        "attention_factor": 1.208,
    }
    assert waiting[1].system_attrs["fixed_params"] == {
        "beta_fast": 0.5632,
        "beta_slow_ratio": 0.01615,
        "attention_factor": 1.208,
    }
    again = open_study(url, {"p": 1}, cfg, space, tiny_geometry())
    assert not again.created and len(again.study.get_trials()) == 2


def test_auto_is_a_gaussian_process_for_few_parameters_and_nsga2_for_longrope():
    """Bug caught: auto still TPE (a search for a cluster's budget), or the GP given LongRoPE's 17 dimensions; the GP
    starting after fewer random points than two per dimension."""
    from ctxeval.evals.tune.search import TuneConfig, gp_startup, make_sampler, sampler_name
    from ctxeval.evals.tune.space import build_space

    cfg = TuneConfig(1024, 128, trials=20)
    yarn = build_space(one_spec("yarn"), tiny_geometry(), 1024)
    longrope = build_space(one_spec("longrope"), tiny_geometry(), 1024)
    ntk = build_space(one_spec("ntk"), tiny_geometry(), 1024)
    assert (sampler_name(cfg, yarn), sampler_name(cfg, longrope), sampler_name(cfg, ntk)) == ("gp", "nsga2", "gp")
    sampler = make_sampler(cfg, yarn)
    assert type(sampler).__name__ == "GPSampler"
    assert (gp_startup(yarn), gp_startup(ntk)) == (6, 4)
    assert sampler._n_startup_trials == 6  # noqa: SLF001 - optuna's own setting, no public accessor


def test_the_study_holds_log_perplexity_and_the_row_the_perplexity(tmp_path):
    """The study's value is ln(ppl at the target) (a Gaussian process fits it; a ppl in the thousands beside ~60 would
    swamp the fit); the row and the winner keep the perplexity. Bug caught: the study given the ppl, or the row the
    log."""
    import optuna
    from typer.testing import CliRunner

    from ctxeval.cli import app

    out = tmp_path / "run"
    result = CliRunner().invoke(
        app,
        [
            "tune",
            "--target-length",
            "256",
            "--tune-docs",
            "1",
            "--heldout-docs",
            "1",
            "--trials",
            "3",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    study = optuna.load_study(study_name="ctxeval-tune", storage=sqlite_url(out / "study.db"))
    for trial in study.get_trials():
        if trial.state.name == "COMPLETE":
            assert trial.value == pytest.approx(math.log(trial.user_attrs["row"]["value"]), rel=1e-12)
            assert 20 < trial.user_attrs["row"]["value"] < 1000
