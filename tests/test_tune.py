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
import threading
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
def module_cache(tmp_path_factory):
    """CTXEVAL_CACHE for the module fixtures (conftest's autouse fixture is per test and starts after them)."""
    path = tmp_path_factory.mktemp("tune-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CTXEVAL_CACHE", str(path))
        yield path


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


# ---------------------------------------------------------------------------------------------------------------
# 1. the search space


def test_yarn_space_searches_betas_and_attention_factor_at_fixed_factor():
    """Bug caught: the factor searched by default (dims gain 'factor'), or fixed at the trained length / target
    (0.125 instead of 8), or a range's log flag dropped."""
    from ctxeval.evals.tune.space import build_space

    space = build_space(one_spec("yarn"), tiny_geometry(), 1024)
    assert space.factor == 1024 / TRAINED == 8.0
    assert space.base.params["factor"] == 8.0
    got = {d.key: (d.kind, d.low, d.high, d.log) for d in space.dims}
    assert got == {
        "beta_fast": (float, 0.5, 128.0, True),
        "beta_slow": (float, 0.01, 16.0, True),
        "attention_factor": (float, 0.8, 1.6, False),
    }
    assert space.pairs == 16 and not space.vector


def test_a_parameter_fixed_in_the_spec_is_not_searched():
    """Bug caught: `if name not in fixed` dropped: yarn:beta_fast=4 would still search beta_fast (and the trial would
    overwrite the user's 4)."""
    from ctxeval.evals.tune.space import build_space

    space = build_space(one_spec("yarn:beta_fast=4"), tiny_geometry(), 1024)
    assert [d.key for d in space.dims] == ["beta_slow", "attention_factor"]
    assert space.base.params["beta_fast"] == 4.0
    spec = space.spec({"beta_slow": 0.5, "attention_factor": 1.1})
    assert spec.params["beta_fast"] == 4.0 and spec.params["factor"] == 8.0


@pytest.mark.parametrize("target,low,high", [(1024, 4.0, 32.0), (512, 2.0, 16.0)])
def test_ntk_alpha_range_is_relative_to_the_factor(target, low, high):
    """alpha in [s/2, 4s]. Bug caught: per="factor" ignored in _bounds (alpha in [1, 4] at every factor)."""
    from ctxeval.evals.tune.space import build_space

    (dim,) = build_space(one_spec("ntk"), tiny_geometry(), target).dims
    assert (dim.key, dim.low, dim.high, dim.log) == ("alpha", low, high, True)


@pytest.mark.parametrize("trained", [128, 256])
def test_self_extend_neighbor_window_is_relative_to_the_trained_length_and_integer(trained):
    """neighbor_window in [L/16, L], whole numbers; group_size in [2, 64]. Bug caught: scale by the factor instead of
    L (or the target), or the int kind lost (a window of 23.7 positions)."""
    from ctxeval.evals.tune.space import build_space
    from ctxeval.rope.methods import Geometry

    space = build_space(one_spec("yarn+self-extend"), Geometry(32, 100000.0, trained), trained * 8)
    dims = {d.key: d for d in space.dims}
    window, group = dims["self-extend.neighbor_window"], dims["self-extend.group_size"]
    assert (window.kind, window.low, window.high) == (int, trained / 16, trained)
    assert (group.kind, group.low, group.high) == (int, 2, 64)
    snapped = space.snap(
        {
            **{k: (d.low + d.high) / 2 for k, d in dims.items()},
            "self-extend.neighbor_window": 23.7,
            "self-extend.group_size": 4,
        }
    )
    assert snapped["self-extend.neighbor_window"] == 23 and isinstance(snapped["self-extend.neighbor_window"], int)
    spec = space.spec(snapped)
    assert spec.attention[0].params["neighbor_window"] == 23


def test_longrope_has_one_dim_per_pair_in_one_to_one_plus_s():
    """Bug caught: the range [1, s] (LongRoPE's dim_mono range is [1, 1 + s]), or d instead of d/2 factors."""
    from ctxeval.evals.tune.space import build_space

    space = build_space(one_spec("longrope"), tiny_geometry(), 1024)
    assert space.vector and space.pairs == 16
    long = [d for d in space.dims if d.name.startswith("long_factor.")]
    assert [d.key for d in long] == [f"long_factor.{i}" for i in range(16)]
    assert all((d.kind, d.low, d.high) == (float, 1.0, 9.0) for d in long)
    assert space.base.params["short_factor"] == tuple([1.0] * 16)


def test_monotone_is_the_running_max():
    """Bug caught: np.minimum.accumulate, or sorting (which moves values between pairs)."""
    from ctxeval.evals.tune.space import monotone

    assert monotone([1.0, 3.0, 2.0, 5.0, 4.0, 4.5]) == (1.0, 3.0, 3.0, 5.0, 5.0, 5.0)
    assert monotone([2.0, 1.0]) == (2.0, 2.0)


def test_snap_rounds_longrope_to_the_grid_and_other_floats_to_four_digits():
    """Bug caught: round(value, 2) applied to every float (beta_slow 0.0123 -> 0.01), or '.4f' instead of '.4g'."""
    from ctxeval.evals.tune.space import build_space

    yarn = build_space(one_spec("yarn"), tiny_geometry(), 1024)
    assert yarn.snap({"beta_fast": 12.34567, "beta_slow": 0.0123456, "attention_factor": 1.23456}) == {
        "beta_fast": 12.35,
        "beta_slow": 0.01235,
        "attention_factor": 1.235,
    }
    assert yarn.snap({"beta_fast": 1e9, "beta_slow": 1e-9, "attention_factor": 1.0})["beta_fast"] == 128.0
    longrope = build_space(one_spec("longrope"), tiny_geometry(), 1024)
    point = {f"long_factor.{i}": 1.0 + i * 0.5123 for i in range(16)}
    point["long_factor.15"] = 9.004  # rounds onto the range's top
    if "attention_factor" in {d.key for d in longrope.dims}:
        point["attention_factor"] = 1.23456
    snapped = longrope.snap(point)
    assert [snapped[f"long_factor.{i}"] for i in range(15)] == [round(1.0 + i * 0.5123, 2) for i in range(15)]
    assert snapped["long_factor.15"] == 9.0
    if "attention_factor" in snapped:
        assert snapped["attention_factor"] == 1.235


def test_spec_of_an_invalid_point_raises():
    """Bug caught: spec() skips resolve_params (beta_slow >= beta_fast would be measured as a method)."""
    from ctxeval.errors import CtxevalError
    from ctxeval.evals.tune.space import build_space

    space = build_space(one_spec("yarn"), tiny_geometry(), 1024)
    for slow in (2.0, 3.0):
        with pytest.raises(CtxevalError, match="beta"):
            space.spec({"beta_fast": 2.0, "beta_slow": slow, "attention_factor": 1.0})
    spec = space.spec({"beta_fast": 4.0, "beta_slow": 0.25, "attention_factor": 1.1})
    assert (spec.name, spec.params) == (
        "yarn",
        {"factor": 8.0, "beta_fast": 4.0, "beta_slow": 0.25, "attention_factor": 1.1},
    )


def test_longrope_seeds_are_pi_ntk_and_yarn_factors():
    """pi = s for every pair; ntk = s^(2i/(d-2)); yarn = s (1 - gamma) + gamma, gamma = YaRN's ramp at beta 32 / 1
    (1 extrapolates, 0 interpolates); each clipped to [1, 1 + s]. Bug caught: the ntk exponent 2i/d (last pair
    s^(15/16) instead of s), or gamma and 1 - gamma swapped (factors decreasing from s to 1)."""
    from ctxeval.evals.tune.space import build_space, longrope_seeds
    from ctxeval.rope.methods import yarn_ramp

    geometry = tiny_geometry()
    s, d = 8.0, 32
    space = build_space(one_spec("longrope"), geometry, 1024)
    seeds = longrope_seeds(space, geometry)
    i = np.arange(d // 2, dtype=np.float64)
    gamma = yarn_ramp(geometry, {"beta_fast": 32.0, "beta_slow": 1.0, "ramp": "index", "truncate": True}, TRAINED)
    want = {
        "pi": np.full(d // 2, s),
        "ntk": np.clip(s ** (2 * i / (d - 2)), 1, 1 + s),
        "yarn": np.clip(s * (1 - gamma) + gamma, 1, 1 + s),
    }
    assert set(seeds) == set(want)
    for name, factors in want.items():
        np.testing.assert_allclose(seeds[name], factors, rtol=1e-12, err_msg=name)
    assert seeds["ntk"][0] == 1.0 and seeds["ntk"][-1] == pytest.approx(s)
    assert seeds["yarn"][0] == 1.0 and seeds["yarn"][-1] == s  # the fastest pair extrapolates, the slowest is s
    assert all(np.all(np.diff(v) >= 0) for v in seeds.values())


# ---------------------------------------------------------------------------------------------------------------
# 2. bad input: one line on stderr, exit code 2, no traceback, no run directory


@pytest.mark.parametrize(
    "args,fragments",
    [
        (["-m", "pi"], ["pi", "--search-factor"]),
        (["-m", "none"], ["none"]),
        (["--target-length", "128"], ["not beyond the trained length 128"]),
        (["--target-length", "64"], ["not beyond the trained length 128"]),
        (["--space", "beta_fast=-1:4"], ["beta_fast must be > 0"]),
        (["-m", "yarn+self-extend", "--space", "self-extend.group_size=0:4"], ["group_size must be >= 1"]),
        (["-m", "ntk", "--space", "alpha=0.5:2"], ["alpha must be >= 1"]),
        (["--space", "beta_fast=4:1"], ["LOW < HIGH"]),
        (["--space", "beta_fast=1"], ["NAME=LOW:HIGH"]),
        (["--space", "beta_fast=a:b"], ["NAME=LOW:HIGH"]),
        (["--space", "beta_fast=1:4:cubic"], ["NAME=LOW:HIGH"]),
        (["--space", "window=1:4"], ["not a searched parameter", "beta_fast"]),
        (["-m", "yarn:beta_fast=4", "--space", "beta_fast=1:8"], ["not a searched parameter"]),
        (["--sampler", "bogus"], ["--sampler", "tpe"]),
        (["-m", "longrope:long_factor=1"], ["long_factor"]),
    ],
)
def test_bad_input_is_one_line_exit_2(args, fragments, tmp_path):
    """Bug caught: a check moved after the run directory is created (a directory left behind, more stderr lines), or
    a check that raises ValueError instead of CtxevalError (a traceback, exit 1)."""
    out = tmp_path / "run"
    result = tune(*SMALL, "--trials", "3", *args, "--out", out)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    for fragment in fragments:
        assert fragment in lines[0]
    assert "Traceback" not in result.output
    assert not out.exists()


@pytest.mark.parametrize("flags", [[], ["--search-factor"]])
def test_none_is_not_told_to_search_its_factor(flags, tmp_path):
    """`-m none` has no factor: the advice must not be --search-factor (which cannot help it, and may already be
    given). Bug caught (present): build_space's 'no parameter to search besides its factor; use --search-factor'
    written for every method without ranges, including none."""
    result = tune(*SMALL, "--trials", "3", "-m", "none", *flags, "--out", tmp_path / "run")
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    assert "--search-factor" not in lines[0] and "besides its factor" not in lines[0], lines[0]


@pytest.mark.parametrize(
    "args,option", [(["--tune-docs", "500"], "--tune-docs"), (["--target-length", "64k"], "--target-length")]
)
def test_too_few_documents_names_the_tune_options(args, option, tmp_path):
    """More documents than the data holds (--tune-docs 500), or none long enough (--target-length 64k): the error must
    name the options of `tune`. Bug caught: the ppl command's wording leaking through from
    corpora.select_long_documents ('--docs 501 was asked; use --docs 12', 'use shorter --lengths')."""
    out = tmp_path / "run"
    result = tune(*SMALL, "--trials", "3", *args, "--out", out)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.stderr
    assert not out.exists()
    assert option in lines[0], lines[0]
    assert "--docs " not in lines[0] and "--lengths" not in lines[0], lines[0]


# ---------------------------------------------------------------------------------------------------------------
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
    params = {"factor": S, **row["params"]}
    assert row["value"] == pytest.approx(_ppl(tiny, tuning, TARGET, "yarn", params), rel=1e-5)
    assert row["ppl_short"] == pytest.approx(_ppl(tiny, tuning, TRAINED, "yarn", params), rel=1e-5)
    baseline = _ppl(tiny, tuning, TRAINED)
    assert record["tune"]["baseline_short"] == pytest.approx(baseline, rel=1e-5)
    assert row["short_rise"] == pytest.approx(row["ppl_short"] / baseline - 1, rel=1e-4, abs=1e-6)


# ---------------------------------------------------------------------------------------------------------------
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


@pytest.fixture(scope="module")
def killed_and_resumed(tmp_path_factory, module_cache):
    """A search killed with SIGKILL after >= 5 finished trials, then rerun (in this process) with --trials = the
    finished count + 5."""
    base = tmp_path_factory.mktemp("tune-killed")
    out = base / "run"
    url = sqlite_url(out / "study.db")
    log = open(base / "killed.log", "w")
    env = {**os.environ, "CTXEVAL_CACHE": str(module_cache)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ctxeval", "tune", *SMALL, "--out", str(out), "--trials", "400"],
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
    result = tune(*SMALL, "--out", out, "--trials", asked)
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


# ---------------------------------------------------------------------------------------------------------------
# 5. two processes on one study


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

        def work():
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


@pytest.mark.slow  # two fresh Python processes at once: ~25 s on 2 CPUs (pytest -m slow tests/test_tune.py)
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


# ---------------------------------------------------------------------------------------------------------------
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
    assert second[0] == first[0]  # trial 0 is the method's defaults, enqueued whatever the seed
    assert all(second[t] != first[t] for t in range(1, 6))


# ---------------------------------------------------------------------------------------------------------------
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
    assert rope["short_factor"] == [1.0] * 16
    assert all(1.0 <= f <= 1.0 + S for f in long)
    factors = json.loads((longrope_run.export / "longrope-factors.json").read_text())
    assert factors["long_factor"] == long and factors["original_max_position_embeddings"] == TRAINED
    assert tune_record["export"]["verification"]["passed"] is True

    fresh = load_model(str(longrope_run.export), dtype="float32", device="cpu")
    ids = torch.randint(3, len(tiny.tokenizer), (1, 1024), generator=torch.Generator().manual_seed(1))
    params = {k: tuple(v) if isinstance(v, list) else v for k, v in winner["params"].items()}
    with torch.no_grad():
        got = fresh.model(ids).logits
        with apply_method(tiny.model, "longrope", tiny.rope.geometry, **params):
            want = tiny.model(ids).logits
    assert float((got - want).abs().max() / want.abs().max()) <= 1e-5


def test_export_refuses_attention_methods_and_dynamic_ntk():
    """No rope_parameters entry can say an attention method, and transformers' dynamic NTK applies its length rule
    differently. Bug caught: the `spec.attention` check dropped (yarn+self-extend exported as plain yarn), or
    dynamic-ntk exported as rope_type 'dynamic'."""
    from ctxeval.errors import CtxevalError
    from ctxeval.evals.tune.export import rope_parameters

    geometry = tiny_geometry()
    with pytest.raises(CtxevalError, match="attention"):
        rope_parameters(one_spec("yarn:factor=8+self-extend"), geometry, 1024)
    with pytest.raises(CtxevalError, match="dynamic-ntk"):
        rope_parameters(one_spec("dynamic-ntk:factor=8"), geometry, 1024)
    assert rope_parameters(one_spec("yarn:factor=8"), geometry, 1024)["rope_type"] == "yarn"


def test_ntk_exports_as_plain_rope_at_the_new_base():
    """A static NTK winner is plain RoPE at base b' (rope_type default): its inverse frequencies are NTK's. Bug caught:
    the exponent d/(d-2) (NTK's own base formula) applied to the ratio of the second pair's frequencies instead of
    d/2."""
    from ctxeval.evals.tune.export import rope_parameters
    from ctxeval.rope.methods import Geometry, compute

    geometry = tiny_geometry()
    for params in ("ntk:alpha=5.3", "ntk:factor=8"):
        spec = one_spec(params)
        entry = rope_parameters(spec, geometry, 1024)
        assert entry["rope_type"] == "default" and set(entry) == {"rope_type", "rope_theta"}
        plain = Geometry(geometry.rotary_dim, entry["rope_theta"], TRAINED).default_inv_freq()
        np.testing.assert_allclose(plain, compute("ntk", geometry, spec.params, 1024).inv_freq, rtol=1e-12)


# ---------------------------------------------------------------------------------------------------------------
# 8. LongRoPE search


def test_longrope_trials_are_on_the_grid_and_monotone(longrope_run):
    """Every trial's long factors are on the 0.01 grid in [1, 1 + s], the method its label names has non-decreasing
    long factors, and the first trials are the PI / NTK / YaRN seeds. Bug caught: snap skipped for the trials
    NSGA-II breeds (crossover gives off-grid values), or spec() without the running max."""
    from ctxeval.evals.tune.space import build_space, longrope_seeds
    from ctxeval.specs import format_param

    space = build_space(one_spec("longrope"), tiny_geometry(), TARGET)
    rows = sorted(rows_of(longrope_run.dir), key=lambda r: r["trial"])
    assert [r["trial"] for r in rows] == list(range(14))
    assert all(r["status"] == "ok" for r in rows)
    for r in rows:
        factors = [r["params"][f"long_factor.{i}"] for i in range(16)]
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
        got = space.spec(rows[number]["params"]).params["long_factor"]
        np.testing.assert_allclose(got, want[name], atol=0.005 + 1e-12)


# ---------------------------------------------------------------------------------------------------------------
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
    assert opened.created and [t.user_attrs["seed"] for t in waiting] == ["defaults"]
    assert waiting[0].system_attrs["fixed_params"] == {"beta_fast": 32.0, "beta_slow": 1.0, "attention_factor": 1.208}
    again = open_study(url, {"p": 1}, cfg, space, tiny_geometry())
    assert not again.created and len(again.study.get_trials()) == 1


def test_factor_is_rounded_as_every_command_rounds_it_and_ntk_searches_no_second_factor():
    """Bug caught: the exact target / trained ratio (7.8125 for 1000 / 128) while --compare specs get default_factor's
    7.82; or --search-factor adding a factor next to ntk's alpha (every point refused by ntk's checks)."""
    from ctxeval.evals.tune.space import build_space
    from ctxeval.specs import default_factor

    space = build_space(one_spec("yarn"), tiny_geometry(), 1000)
    assert space.factor == default_factor(1000, 128) == 7.82 and space.base.params["factor"] == 7.82
    ntk = build_space(one_spec("ntk"), tiny_geometry(), 1024, search_factor=True)
    assert [d.key for d in ntk.dims] == ["alpha"]


def test_export_that_cannot_be_written_fails_before_the_search(tmp_path):
    """--export naming a file, or the model's own directory: one line, exit 2, no run directory. Bug caught: the checks
    running only after the search and the held-out run (minutes lost, or a NotADirectoryError traceback)."""
    from ctxeval.util.paths import TINY_MODEL_DIR

    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    for where, words in ((a_file, "is a file"), (TINY_MODEL_DIR, "exists and is not an earlier export")):
        out = tmp_path / "run"
        result = tune(*SMALL, "--trials", "2", "--export", where, "--out", out)
        assert result.exit_code == 2, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and words in lines[0] and "Traceback" not in result.output, result.stderr
        assert not out.exists()
