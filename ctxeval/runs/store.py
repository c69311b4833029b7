"""Run directory: run.json (status + full provenance) and rows.jsonl (one JSON line per measured point).

run.json is written before the first point (status `running`) and finalised as `success`, `error` or
`interrupted`. Rows are appended and flushed one point at a time, so a crash or Ctrl-C loses at most the point in
flight. A rerun with the same spec skips the points already there; a different spec is refused unless overwrite.
Under torchrun, rank r appends to rows.rank<r>.jsonl and only rank 0 writes run.json; rank 0 merges the rank files
into rows.jsonl at the end. Reading always includes leftover rank files, so a crashed distributed run resumes with
any number of ranks.

The store that writes run.json (a single process, or rank 0 for the whole torchrun job) holds the directory's lock
(lock.py) from before it looks at the directory until `close()`: a second process on the same directory is
refused, and `overwrite` never deletes a directory another process measures into.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any, Iterable

from ..errors import CtxevalError
from ..util import textfiles
from .lock import LOCK_NAME, RunLock, refuse_if_held
from .rows import KINDS, point_key, row_problem

RUN_FILE, ROWS_FILE = "run.json", "rows.jsonl"
RANK_ROWS_GLOB = "rows.rank*.jsonl"


def now_utc() -> str:
    """The current UTC time, ISO 8601 to the second (run.json and report.json stamps)."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def environment() -> dict[str, Any]:
    """Library versions, machine and git commit of the ctxeval checkout (if any)."""
    versions = {}
    for name in ("ctxeval", "torch", "transformers", "datasets", "numpy", "accelerate", "gguf"):
        try:
            versions[name] = version(name)
        except Exception:  # not installed
            versions[name] = None
    commit = None
    try:
        here = Path(__file__).resolve().parent
        commit = (
            subprocess.run(
                ["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
            ).stdout.strip()
            or None
        )
        dirty = subprocess.run(
            ["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
        if commit and dirty:
            commit += "+dirty"
    except (OSError, subprocess.SubprocessError):
        pass
    gpu = None
    try:
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            gpu = {
                "name": props.name,
                "memory_gib": round(props.total_memory / 2**30, 1),
                "count": torch.cuda.device_count(),
                "capability": f"{props.major}.{props.minor}",
                # the kernels sdpa may pick from (it takes flash when the inputs allow, else the next)
                "sdpa_kernels": [
                    k
                    for k, on in (
                        ("flash", torch.backends.cuda.flash_sdp_enabled()),
                        ("mem_efficient", torch.backends.cuda.mem_efficient_sdp_enabled()),
                        ("cudnn", torch.backends.cuda.cudnn_sdp_enabled()),
                        ("math", torch.backends.cuda.math_sdp_enabled()),
                    )
                    if on
                ],
            }
    except Exception:
        pass
    return {
        "versions": versions,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "gpu": gpu,
        "git_commit": commit,
        "argv": [Path(sys.argv[0]).name, *sys.argv[1:]] if sys.argv else [],  # the program by name, not its path
    }


def how_it_ended(record: dict[str, Any]) -> str:
    """A run's end from its run.json: its status and the first line of its error ("status error: ...")."""
    status = str(record.get("status") or "unknown")
    error = str(record.get("error") or "").strip().splitlines()
    return f"status {status}" + (f": {error[0][:160]}" if error else "")


def refuse_foreign(out: Path, overwrite: bool) -> None:
    """A file, or a folder with other things in it and no run.json, is no run directory (--overwrite empties the
    folder)."""
    if out.exists() and not out.is_dir():
        raise CtxevalError(f"--out {out} is a file, not a directory; choose a directory path")
    through_file = next((parent for parent in out.parents if parent.exists() and not parent.is_dir()), None)
    if through_file is not None:
        raise CtxevalError(f"cannot create the run directory {out} ({through_file} is a file); choose another --out")
    if (
        out.is_dir()
        and not (out / RUN_FILE).exists()
        and not overwrite
        and any(p.name != LOCK_NAME for p in out.iterdir())
    ):
        raise CtxevalError(f"{out} exists and is not a ctxeval run directory; use another --out or --overwrite")


def check_run_dir(out: Path, overwrite: bool = False) -> None:
    """What RunStore would refuse about `out` before it reads a spec, checked without creating or locking anything:
    a command calls it before it loads a model, so a wrong --out or a second process on one directory is refused
    in a second, not after the load. RunStore checks again when it opens (and takes) the directory."""
    out = Path(out)
    refuse_foreign(out, overwrite)
    refuse_if_held(out)
    run_path = out / RUN_FILE
    if run_path.exists() and not overwrite:
        try:
            record = textfiles.read_json(run_path, "", finite=False)
            problem = None if isinstance(record, dict) else "not a JSON object"
        except CtxevalError as exc:
            problem = str(exc)
        if problem:
            raise CtxevalError(
                f"{out}: run.json cannot be read as a ctxeval run ({problem}); use another --out, "
                "or --overwrite to replace the directory"
            )


class RunStore:
    """One run directory. `spec` is what defines the measurement; resume requires the same spec."""

    def __init__(self, out: Path, spec: dict[str, Any], overwrite: bool = False, rank: int | None = None) -> None:
        """rank None: a single process (rows.jsonl, writes run.json); rank r under torchrun: appends to
        rows.rank<r>.jsonl, and only rank 0 writes run.json (the others open a directory rank 0 prepared)."""
        self.dir = Path(out)
        self.writer = rank in (None, 0)
        self.append_path = self.dir / (ROWS_FILE if rank is None else f"rows.rank{rank}.jsonl")
        refuse_foreign(self.dir, overwrite)
        self.spec = json.loads(json.dumps(spec, default=str))  # normalise (tuples -> lists, ...)
        self.run_path, self.rows_path = self.dir / RUN_FILE, self.dir / ROWS_FILE
        self.record: dict[str, Any] = {}
        self.lock = RunLock(self.dir) if self.writer else None
        if self.lock is not None:
            try:
                self.lock.acquire()  # before reading or replacing anything: one measuring process per directory
            except OSError as exc:  # the directory cannot be made there (a path through a file, a full disk)
                raise CtxevalError(
                    f"cannot create the run directory {self.dir} ({exc.strerror or type(exc).__name__})"
                    "; choose another --out"
                ) from None
        try:
            self._open(overwrite)
        except BaseException:
            self.close()
            raise

    def _open(self, overwrite: bool) -> None:
        if not self.run_path.exists():
            return
        try:
            old = textfiles.read_json(self.run_path, "", finite=False)
            if not isinstance(old, dict):
                raise CtxevalError(f"{self.run_path} is not a JSON object")
        except CtxevalError as exc:
            if not (overwrite and self.writer):
                raise CtxevalError(
                    f"{self.dir}: run.json cannot be read as a ctxeval run ({exc}); use another --out, "
                    "or --overwrite to replace the directory"
                ) from None
            old = {}
        if old.get("spec") == self.spec:
            # a resumed record keeps its history and methods only when they have the shapes ctxeval writes
            self.record = {
                **old,
                "history": [h for h in old.get("history") or [] if isinstance(h, dict)]
                if isinstance(old.get("history"), list)
                else [],
                "methods": old["methods"] if isinstance(old.get("methods"), dict) else {},
            }
            return
        if not self.writer:
            raise CtxevalError(
                f"{self.dir}: run.json holds another spec than this rank's; all ranks must run one command"
            )
        if not overwrite:
            before = old.get("spec") if isinstance(old.get("spec"), dict) else {}
            changed = sorted(k for k in set(before) | set(self.spec) if before.get(k) != self.spec.get(k))
            raise CtxevalError(
                f"{self.dir} holds a run with a different spec (differs in: {', '.join(changed)}); "
                "use another --out, or --overwrite to replace it"
            )
        for path in self.dir.iterdir():  # everything but the lock this store holds
            if path.name == LOCK_NAME:
                continue
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()

    def close(self) -> None:
        """Release the directory's lock (the kernel releases it anyway when the process ends)."""
        if self.lock is not None:
            self.lock.release()

    def __enter__(self) -> "RunStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- rows ------------------------------------------------------------------------------------------------------
    def rows(self) -> list[dict[str, Any]]:
        """rows.jsonl, then every rank file (a distributed run in progress or one that crashed): the rows a report
        or a resume can use (rows.row_problem); the others are counted by `skipped_notes`."""
        return [r for f in self._row_files() for r in f.rows]

    def _row_files(self) -> list["RowsFile"]:
        kind = self.spec.get("task") if self.spec.get("task") in KINDS else None
        return [load_rows(self.rows_path, kind)] + [load_rows(p, kind) for p in self._rank_files()]

    def skipped_notes(self) -> list[str]:
        """One note per rows file with lines a report or a resume cannot use (their points are measured again)."""
        return [note for note in (f.note() for f in self._row_files()) if note]

    def _rank_files(self) -> list[Path]:
        def rank(p: Path) -> int:
            digits = p.name[len("rows.rank") : -len(".jsonl")]
            return int(digits) if digits.isdigit() else -1

        return sorted(self.dir.glob(RANK_ROWS_GLOB), key=rank)

    def merge_rank_files(self) -> None:
        """Append the rows of every rows.rank<r>.jsonl to rows.jsonl (rank order), then remove the rank files."""
        for path in self._rank_files():
            rows = textfiles.read_jsonl(path, "rows file").objects()
            if rows:
                self._append_to(self.rows_path, rows)
            path.unlink()

    def done_points(self, key_fields: Iterable[str]) -> set[tuple]:
        """Point keys (rows.point_key over `key_fields`) of the points measured so far; failed points are not
        done, so a resume measures them again."""
        return {point_key(r, key_fields) for r in self.rows() if r.get("status") == "ok"}

    def append(self, rows: list[dict[str, Any]]) -> None:
        """Append rows of one point and make them durable before returning."""
        self._append_to(self.append_path, rows)

    @staticmethod
    def _append_to(path: Path, rows: list[dict[str, Any]]) -> None:
        try:
            with open(path, "a+", encoding="utf-8") as fh:
                if fh.tell() > 0:  # a torn last line (crash mid-write) must not swallow the next row
                    fh.seek(fh.tell() - 1)
                    if fh.read(1) != "\n":
                        fh.write("\n")
                for row in rows:
                    fh.write(json.dumps(row, default=float) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:  # a disk that filled up: the rows before this point are kept, a torn line is skipped
            raise CtxevalError(
                f"cannot append to {path} ({exc.strerror or type(exc).__name__}); the points measured "
                "so far are kept: free some space and rerun the same command to resume"
            ) from None

    # -- run.json -------------------------------------------------------------------------------------------------
    def start(self, provenance: dict[str, Any]) -> None:
        history = self.record.get("history", [])
        if self.record:
            history.append({k: self.record.get(k) for k in ("status", "started", "finished", "error", "environment")})
        self.record = {
            "status": "running",
            "started": now_utc(),
            "finished": None,
            "spec": self.spec,
            **provenance,
            "environment": environment(),
            "history": history,
        }
        self._write()

    def update(self, **fields: Any) -> None:
        self.record.update(fields)
        self._write()

    def finish(self, status: str, error: str | None = None, **fields: Any) -> None:
        self.record.update(status=status, finished=now_utc(), error=error, **fields)
        self._write()

    def _write(self) -> None:
        if not self.writer:
            return
        textfiles.write_text(self.run_path, json.dumps(self.record, indent=2, default=str))


@dataclass
class RowsFile:
    """A rows file as read: the rows a `kind` run can use, and (line, why) for every line it cannot (not UTF-8, not
    JSON, not an object, nested too deep, or a row rows.row_problem refuses; a line torn by a crash is one of them)."""

    path: Path
    rows: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[tuple[int, str]] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)  # the line number of each row

    def checked(self, kind: str) -> "RowsFile":
        """The same file with every row also checked as a `kind` row (rows.row_problem)."""
        out = RowsFile(self.path, skipped=list(self.skipped))
        for number, row in zip(self.lines, self.rows):
            why = row_problem(row, kind)
            if why is None:
                out.rows.append(row)
                out.lines.append(number)
            else:
                out.skipped.append((number, why))
        out.skipped.sort()
        return out

    def note(self) -> str | None:
        """'skipped 2 of 40 lines of DIR/rows.jsonl (line 3: not JSON; line 9: length nan ...)', or None."""
        if not self.skipped:
            return None
        shown = "; ".join(f"line {n}: {why}" for n, why in self.skipped[:3])
        more = f" (+{len(self.skipped) - 3} more)" if len(self.skipped) > 3 else ""
        return (
            f"skipped {len(self.skipped)} of {len(self.skipped) + len(self.rows)} lines of {self.path} that are "
            f"not usable rows ({shown}{more}); their points count as not measured"
        )


def load_rows(path: Path, kind: str | None = None) -> RowsFile:
    """A rows file read line by line (a missing file has no rows); with `kind`, every row is also checked with
    rows.row_problem."""
    lines = textfiles.read_jsonl(path, "rows file")
    out = RowsFile(Path(path), [row for _, row in lines.records], list(lines.problems), [n for n, _ in lines.records])
    return out.checked(kind) if kind else out


def read_rows(path: Path, kind: str | None = None) -> list[dict[str, Any]]:
    """The usable rows of a rows.jsonl (load_rows); a torn last line (crash mid-write) is skipped."""
    return load_rows(path, kind).rows


class run_status:
    """Finalise run.json whatever happens: success, error (with the message) or interrupted (Ctrl-C)."""

    def __init__(self, store: RunStore) -> None:
        self.store = store

    def __enter__(self) -> RunStore:
        return self.store

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: Any) -> bool:
        if exc_type is None:
            self.store.finish("success")
        elif issubclass(exc_type, KeyboardInterrupt):
            self.store.finish("interrupted", error="interrupted by the user (Ctrl-C); rerun the same command to resume")
        else:
            self.store.finish("error", error=f"{exc_type.__name__}: {exc}")
        return False
