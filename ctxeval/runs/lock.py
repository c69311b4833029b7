"""One measuring process per run directory: an OS file lock on ``<run_dir>/.lock``.

A process that measures into a run directory holds ``fcntl.flock(LOCK_EX)`` on ``run_dir / ".lock"`` through an
fd it keeps open for as long as it holds the lock. The kernel drops the lock when that fd is closed, which includes
the process dying, so ``kill -9`` never leaves a stale lock. The file itself may stay behind: its existence means
nothing, only the flock counts, and it is never deleted (deleting races with another process about to lock it).
After locking, the holder writes who it is (pid, host, start time, argv) into the file as JSON, so that a refused
process can say who is in the way.

flock locks belong to an open file description, not to a process: two ``RunLock`` objects in one process on the
same directory conflict as well. Children started with ``fork`` share the parent's description and so keep the
lock alive while they run.

Limits:

- Platforms without ``fcntl`` (Windows): no locking at all; ``acquire`` always succeeds and ``holder`` is None.
- NFS and other network filesystems: flock may be local to one node, so two nodes can both hold it. With torchrun
  multi-node jobs, rank 0 holds the lock for the whole job and the other ranks do not lock.
- A filesystem that refuses locks outright (e.g. ENOLCK): a warning, and the run goes ahead unlocked.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
import warnings
from datetime import datetime, timezone
from pathlib import Path

from ..errors import CtxevalError

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

LOCK_NAME = ".lock"
_MAX_INFO_BYTES = 64 * 1024


def lock_path(run_dir: Path) -> Path:
    return Path(run_dir) / LOCK_NAME


class RunLock:
    """An exclusive, non-blocking lock on a run directory; use as ``with RunLock(run_dir): ...``."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.path = lock_path(self.run_dir)
        self._fd: int | None = None
        self._held = False

    @property
    def held(self) -> bool:
        return self._held

    def acquire(self) -> None:
        """Take the lock, or raise CtxevalError naming the process that holds it. A no-op if already held."""
        if self._held:
            return
        if fcntl is None:
            self._held = True
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            info = _read_info(fd)
            os.close(fd)
            raise CtxevalError(
                _in_use_message(self.run_dir, info, "wait for it to finish, or use another --out")
            ) from None
        except OSError as err:
            os.close(fd)
            if err.errno not in (errno.ENOLCK, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise
            warnings.warn(f"cannot lock {self.path} ({err.strerror}); running without a lock", stacklevel=2)
            self._held = True
            return
        self._fd = fd
        self._held = True
        _write_info(fd)

    def release(self) -> None:
        """Drop the lock and close its fd; the file stays. A no-op if not held."""
        if not self._held:
            return
        self._held = False
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    def __del__(self) -> None:  # a dropped lock object releases its lock (the kernel would at exit anyway)
        try:
            self.release()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def refuse_if_held(run_dir: Path) -> None:
    """Raise the same one-line error as acquire() when another process holds run_dir's lock; takes nothing (a command
    calls it before it loads a model, long before it locks the directory)."""
    info = holder(run_dir)
    if info is not None:
        raise CtxevalError(_in_use_message(Path(run_dir), info, "wait for it to finish, or use another --out"))


def holder(run_dir: Path) -> dict | None:
    """The info of the process holding the lock on run_dir ({} if it wrote none readable), or None if nobody does."""
    if fcntl is None:
        return None
    try:
        fd = os.open(lock_path(run_dir), os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            # a shared lock conflicts only with an exclusive one, so a successful probe means nobody holds the run
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_info(fd) or {}
        except OSError:
            return None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _write_info(fd: int) -> None:
    info = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "argv": sys.argv,
    }
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
    os.fsync(fd)


def _read_info(fd: int) -> dict | None:
    """The holder's JSON from the lock file, or None if it is empty or garbled (e.g. read mid-write)."""
    try:
        info = json.loads(os.pread(fd, _MAX_INFO_BYTES, 0).decode())
    except (OSError, ValueError, RecursionError):  # RecursionError: a file another tool filled with brackets
        return None
    return info if isinstance(info, dict) else None


def _in_use_message(run_dir: Path, info: dict | None, advice: str) -> str:
    if info and "pid" in info:
        who = f"pid {info['pid']} on host {info.get('host', '?')}, started {info.get('started', '?')}"
    else:
        who = "holder unknown"
    return f"{run_dir} is in use by another ctxeval process ({who}); {advice}"
