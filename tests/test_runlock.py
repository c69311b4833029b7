"""The run-directory lock: real flock behaviour, in-process and against a child process killed with SIGKILL."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ctxeval.errors import CtxevalError
from ctxeval.runs.lock import RunLock, holder

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="no fcntl: locking is off on Windows")

REPO = Path(__file__).resolve().parents[1]


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
