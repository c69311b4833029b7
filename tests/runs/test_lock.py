"""The run-directory lock: real flock behaviour, in-process and against a child process killed with SIGKILL."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ctxeval.cli import app
from ctxeval.errors import CtxevalError
from ctxeval.runs.lock import RunLock, holder
from ctxeval.runs.store import RunStore

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="no fcntl: locking is off on Windows")


REPO = Path(__file__).resolve().parents[2]


def wait_until(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s")


def child_holds(child, run_dir):
    assert child.poll() is None, f"child exited early with {child.returncode}"
    return (holder(run_dir) or {}).get("pid") == child.pid


def test_second_lock_is_refused_until_release(tmp_path):
    run_dir = tmp_path / "runs" / "a"  # parents created on acquire
    first, second = RunLock(run_dir), RunLock(run_dir)
    first.acquire()
    try:
        assert first.held
        first.acquire()  # same object: a no-op
        with pytest.raises(CtxevalError) as err:
            second.acquire()
        message = str(err.value)
        assert "in use" in message and f"pid {os.getpid()}" in message and "--out" in message
        assert "\n" not in message
        assert not second.held
    finally:
        first.release()
    assert not first.held
    first.release()  # not held: a no-op
    with second:
        assert second.held
    assert not second.held


def test_lock_held_by_killed_child_is_not_stale(tmp_path):
    run_dir = tmp_path / "run"
    code = "import sys, time; from ctxeval.runs.lock import RunLock; lock = RunLock(sys.argv[1]); lock.acquire(); time.sleep(60)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.Popen([sys.executable, "-c", code, str(run_dir)], env=env)
    try:
        wait_until(lambda: child_holds(child, run_dir))
        with pytest.raises(CtxevalError, match=f"in use .*pid {child.pid}"):
            RunLock(run_dir).acquire()
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=5)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=5)
    assert (run_dir / ".lock").exists()
    assert holder(run_dir) is None
    with RunLock(run_dir) as lock:
        assert lock.held


def test_lock_file_names_the_holder(tmp_path):
    with RunLock(tmp_path):
        info = json.loads((tmp_path / ".lock").read_text())
        assert info["pid"] == os.getpid()
        assert {"host", "started", "argv"} <= info.keys()
        assert holder(tmp_path)["pid"] == os.getpid()
    assert holder(tmp_path) is None


def test_garbled_holder_info(tmp_path):
    with RunLock(tmp_path):
        (tmp_path / ".lock").write_text("{not json")
        assert holder(tmp_path) == {}
        with pytest.raises(CtxevalError, match=r"\(holder unknown\)"):
            RunLock(tmp_path).acquire()


# One measuring process per run directory, as a user meets it: a second `ctxeval ppl` on a directory another
# process measures into exits 2 with one line naming the holder, `--overwrite` cannot delete it, the lock is gone
# after `kill -9` of the holder, torchrun ranks share rank 0's lock, and `ctxeval report` needs no lock.


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
