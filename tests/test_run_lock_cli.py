"""One measuring process per run directory, as a user meets it: a second `ctxeval ppl` on a directory another
process measures into exits 2 with one line naming the holder, `--overwrite` cannot delete it, the lock is gone
after `kill -9` of the holder, torchrun ranks share rank 0's lock, and `ctxeval report` needs no lock."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from ctxeval.cli import app
from ctxeval.errors import CtxevalError
from ctxeval.runs.lock import holder
from ctxeval.runs.store import RunStore

runner = CliRunner()
# a process that holds a run directory the way a measuring `ctxeval` does (RunStore locks it) and then waits
HOLDER = (
    "import sys, time\nfrom ctxeval.runs.store import RunStore\n"
    "store = RunStore(sys.argv[1], {'task': 'holder'}, overwrite=True)\nstore.start({})\n"
    "print('holding', flush=True)\ntime.sleep(120)\n"
)


def _ppl(model_dir, text_dir, out, *extra):
    return [
        "ppl",
        "--model",
        str(model_dir),
        "--data",
        str(text_dir),
        "--lengths",
        "32,64",
        "--device",
        "cpu",
        "--out",
        str(out),
        *extra,
    ]


@pytest.fixture
def held(tmp_path):
    """A run directory held by another process; yields (directory, its pid)."""
    run_dir = tmp_path / "run"
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "holding"
        yield run_dir, child
    finally:
        child.kill()
        child.wait(timeout=10)


def test_second_process_is_refused_and_kill_9_leaves_no_stale_lock(held, tiny_model_dir, text_dir):
    run_dir, child = held
    before = sorted(p.name for p in run_dir.iterdir())
    result = runner.invoke(app, _ppl(tiny_model_dir, text_dir, run_dir))
    assert result.exit_code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "in use by another ctxeval process" in lines[0] and f"pid {child.pid}" in lines[0]
    assert "Traceback" not in result.output
    # --overwrite (the spec differs from the holder's) must not delete what the other process measures into
    result = runner.invoke(app, _ppl(tiny_model_dir, text_dir, run_dir, "--overwrite"))
    assert result.exit_code == 2 and f"pid {child.pid}" in result.stderr
    assert sorted(p.name for p in run_dir.iterdir()) == before
    assert json.loads((run_dir / "run.json").read_text())["spec"] == {"task": "holder"}

    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=10)
    deadline = time.monotonic() + 5
    while holder(run_dir) is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert (run_dir / ".lock").exists() and holder(run_dir) is None  # the file stays; the lock went with the process
    result = runner.invoke(app, _ppl(tiny_model_dir, text_dir, run_dir, "--overwrite"))
    assert result.exit_code == 0, result.output
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "success" and record["spec"]["task"] == "ppl"  # replaced, once nobody held it
    assert holder(run_dir) is None  # released when the command ended


def test_report_reads_a_held_directory(tmp_path, tiny_model_dir, text_dir):
    run_dir = tmp_path / "run"
    assert runner.invoke(app, _ppl(tiny_model_dir, text_dir, run_dir)).exit_code == 0
    with RunStore(run_dir, json.loads((run_dir / "run.json").read_text())["spec"]):  # measuring again, say
        result = runner.invoke(app, ["report", str(run_dir)])
    assert result.exit_code == 0 and "Perplexity" in result.stdout


def test_torchrun_ranks_share_rank_0s_lock(tmp_path):
    spec = {"task": "x"}
    with RunStore(tmp_path / "d", spec) as rank0:  # rank 0 holds the directory for the job
        rank1 = RunStore(tmp_path / "d", spec, rank=1)  # another rank of the same job opens it
        assert rank1.lock is None and rank0.lock.held
        with pytest.raises(CtxevalError, match="in use"):
            RunStore(tmp_path / "d", spec)  # any other process is refused
