"""`ctxeval tune --time-budget` on a fake clock: every forward of the search (each trial and plain RoPE's baseline)
takes exactly TRIAL seconds of it, so the number of trials each budget allows is known in advance and no assertion
depends on how loaded the machine is. The clock is the `time` of evals/tune/search.py and job.py, the only modules
that read it for the deadline; the forwards themselves are real (the tiny model at a 256-token target).

Each test names, in its docstring, the one-line bug it catches.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ctxeval.cli import app
from ctxeval.evals.tune import job as job_module
from ctxeval.evals.tune import search as search_module
from ctxeval.evals.tune.scoring import TrialScorer

TRIAL = 10.0  # seconds of the fake clock per forward
ARGS = ["--target-length", "256", "--tune-docs", "1", "--heldout-docs", "1", "--short-tolerance", "0.2"]
METHODS = ("yarn", "ntk", "longrope")


@dataclass
class FakeClock:
    """time.monotonic and time.perf_counter for the deadline code; every other name is the real time module's."""

    now: float = 1000.0
    forwards: list[tuple[str, float, float]] = field(default_factory=list)  # (method, start, end) of each forward

    def monotonic(self) -> float:
        return self.now

    perf_counter = monotonic

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(search_module, "time", fake)
    monkeypatch.setattr(job_module, "time", fake)
    real_score = TrialScorer.score

    def timed(self: TrialScorer, spec: Any) -> Any:
        start = fake.now
        score = real_score(self, spec)
        fake.now += TRIAL
        fake.forwards.append((spec.name, start, fake.now))
        return score

    monkeypatch.setattr(TrialScorer, "score", timed)
    return fake


def tune(*args: Any) -> Any:
    result = CliRunner().invoke(app, ["tune", *map(str, args)])
    assert result.exit_code == 0, result.output
    return result


def record_of(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "run.json").read_text())


def searches(clock: FakeClock) -> list[tuple[str, float, float]]:
    """(method, start, seconds) of each method's search in order; plain RoPE's baseline counts in the search that
    measured it (the first)."""
    out: list[tuple[str, float, float]] = []
    pending = 0.0
    for method, start, end in clock.forwards:
        if method == "none":
            pending += end - start
            continue
        if out and out[-1][0] == method:
            out[-1] = (method, out[-1][1], out[-1][2] + end - start)
        else:
            out.append((method, start - pending, end - start + pending))
            pending = 0.0
    return out


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.6f}"


def test_a_budget_below_one_trial_still_gives_every_method_its_first_trial(tmp_path: Path, clock: FakeClock) -> None:
    """3 methods, a 3 s budget, 10 s per trial: each method's search runs exactly one trial (the first always runs,
    the second would end past the share). Bug caught: `not counted(finished(study))` dropped from no_time, which
    gives 0/0/0 trials (plain RoPE's baseline already ends past the first share, and the later shares are
    negative). The plain-RoPE forward runs once, and the held-out re-measure runs after the out-of-time searches."""
    out = tmp_path / "run"
    result = tune(
        *(f for m in METHODS for f in ("-m", m)), *ARGS, "--trials", "400", "--time-budget", minutes(3), "--out", out
    )
    for method in METHODS:
        summary = record_of(out / f"search-{method}")["tune"]
        assert summary["trials"] == 1 and summary["out_of_time"] is True, (method, summary)
    assert [m for m, _, _ in clock.forwards] == ["none", *METHODS]  # plain RoPE's baseline measured once for all
    assert "--time-budget reached" in result.output
    assert (out / record_of(out)["tune"]["heldout_dir"]).is_dir()  # the held-out re-measure runs on what was found


def test_no_trial_starts_that_would_end_past_the_budget(tmp_path: Path, clock: FakeClock) -> None:
    """One method, a 36 s budget, 10 s per forward: the baseline and two trials end at 30 s; a third would end at
    40 s, so it does not start. The budget is used to within one trial. Bug caught: the expected trial time taken
    as 0 (`expected = 0.0`): the third trial starts at 30 s and ends 4 s past the budget."""
    budget = 36.0
    start = clock.now
    tune("-m", "yarn", *ARGS, "--trials", "400", "--time-budget", minutes(budget), "--out", tmp_path / "run")
    summary = record_of(tmp_path / "run")["tune"]
    assert summary["out_of_time"] is True and summary["trials"] == 2
    assert (tmp_path / "run" / summary["heldout_dir"]).is_dir()  # one method: the whole budget is its search's
    ends = [end for _, _, end in clock.forwards]
    assert max(ends) <= start + budget  # nothing ran past the budget
    assert max(ends) > start + budget - TRIAL  # and it stopped only when one more trial would not fit


def test_each_method_gets_an_equal_share_of_the_time_left(tmp_path: Path, clock: FakeClock) -> None:
    """3 methods, 96 s, 10 s per forward: yarn's share is 32 s (the baseline and 2 trials: 30 s), ntk's is half of
    the 66 s left (3 trials), longrope's all of the 36 s left (3 trials): each method uses its share to within one
    trial, the search the whole budget to within one trial. Bug caught: each share `(end - now) / len(families)`
    instead of the time left over the methods left (ntk 2 trials, longrope 1: 60 of the 96 s used)."""
    budget = 96.0
    begin = clock.now
    out = tmp_path / "run"
    tune(
        *(f for m in METHODS for f in ("-m", m)),
        *ARGS,
        "--trials",
        "400",
        "--time-budget",
        minutes(budget),
        "--out",
        out,
    )
    done = searches(clock)
    assert [m for m, _, _ in done] == list(METHODS)
    for index, (method, start, used) in enumerate(done):
        share = (begin + budget - start) / (len(METHODS) - index)
        assert share - TRIAL < used <= share, (method, share, used)
    total = sum(used for _, _, used in done)
    assert budget - TRIAL < total <= budget
    assert [record_of(out / f"search-{m}")["tune"]["trials"] for m in METHODS] == [2, 3, 3]


def test_a_larger_budget_continues_the_study_in_the_default_directory(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --out, the same command with a larger --time-budget names the same run directory and continues its
    study (the note of an out-of-time search says so): 2 trials in 36 s, then 7 more in 72 s, none measured twice.
    Bug caught: time_budget missing from runs/naming.py's HOW_NOT_WHAT (the rerun started a new study in a new
    directory)."""
    monkeypatch.chdir(tmp_path)
    first = tune("-m", "yarn", *ARGS, "--trials", "400", "--time-budget", minutes(36))
    assert "the same command with a larger budget continues the study" in " ".join(first.output.split())
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert record_of(run_dir)["tune"]["trials"] == 2
    tune("-m", "yarn", *ARGS, "--trials", "400", "--time-budget", minutes(72))
    assert [p.name for p in (tmp_path / "runs").iterdir()] == [run_dir.name]
    summary = record_of(run_dir)["tune"]
    assert summary["trials"] == 9 and summary["measured_now"] == 7
    assert [m for m, _, _ in clock.forwards].count("none") == 1  # the study kept plain RoPE's baseline
