"""Files from outside ctxeval (essays, word lists, factor files, presets, RULER samples, run directories someone else
wrote) are read here, and the files a later run trusts are written here.

Every reader checks what an accidental or hostile file can break, and answers with one CtxevalError line that names
the file, what was expected and what to do: it must be a regular file (a FIFO or /dev/zero would never end), no
larger than a limit, UTF-8 text, and (JSON) parse to a value nested no deeper than a limit, with finite numbers
unless the caller accepts NaN and Infinity (rows.jsonl: ctxeval's own writer lets NaN through in fields the reports
do not read; the rows are checked field by field in rows.row_problem). JSON Lines are read line by line: a line that
is not UTF-8, not JSON, not an object or too deep is reported with its number, and the caller decides whether that
skips the line or refuses the file.

Every writer writes a temporary file beside the target and renames it over the target (os.replace), so that a crash,
a full disk or Ctrl-C leaves either the old file or the new one, never half of one; a write that fails removes the
temporary file and is one line. A target that exists and is not a regular file (/dev/null, /dev/full, a FIFO) is
written in place: renaming over a device would replace the device.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from ..errors import CtxevalError

MAX_TEXT_BYTES = 1 << 31  # 2 GiB: a text ctxeval reads whole (essays, a corpus file, hotpotqa.json is 46 MB)
MAX_SMALL_BYTES = 64 << 20  # 64 MiB: settings-sized files (factor lists, presets, run.json, key-tokens.json)
MAX_JSON_DEPTH = 64  # nesting any file ctxeval reads needs (RULER's QA files: 6); 200k levels would crash a parser


class FileError(CtxevalError):
    """A file that cannot be read as asked; `reason` says why in a few words ('No such file or directory', 'not UTF-8
    text (byte 0xff at offset 3)'), for a caller that words the error itself."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def _describe(path: Path, what: str) -> str:
    return f"{what} {path}" if what else str(path)


def _check_regular(path: Path, what: str) -> os.stat_result:
    try:
        info = path.stat()
    except FileNotFoundError:
        raise FileError(
            f"cannot read {_describe(path, what)} (No such file or directory); check the path",
            "No such file or directory",
        ) from None
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise FileError(f"cannot read {_describe(path, what)} ({reason})", reason) from None
    if stat.S_ISDIR(info.st_mode):
        raise FileError(f"{_describe(path, what)} is a directory; give a file", "a directory")
    if not stat.S_ISREG(info.st_mode):
        raise FileError(
            f"{_describe(path, what)} is not a regular file (a device, FIFO or socket); give a file",
            "not a regular file",
        )
    return info


def read_bytes(path: Path | str, what: str = "", max_bytes: int = MAX_TEXT_BYTES) -> bytes:
    """A regular file's bytes, at most `max_bytes` of them; one line naming the file otherwise."""
    path = Path(path)
    _check_regular(path, what)
    try:
        with open(path, "rb") as fh:
            raw = fh.read(max_bytes + 1)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise FileError(f"cannot read {_describe(path, what)} ({reason})", reason) from None
    if len(raw) > max_bytes:
        raise FileError(
            f"{_describe(path, what)} is larger than {_size(max_bytes)}, more than ctxeval reads from "
            "such a file; check that it is the file you meant",
            f"larger than {_size(max_bytes)}",
        )
    return raw


def _size(n: int) -> str:
    return f"{n / 2**30:g} GiB" if n >= 2**30 else f"{n / 2**20:g} MiB" if n >= 2**20 else f"{n:,} bytes"


def decode(raw: bytes, where: str) -> str:
    """UTF-8 text (strict); a one-line error naming `where`, the offset and the likely encoding otherwise."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        guess = (
            " (it starts with a UTF-16 byte-order mark)"
            if raw[:2] in (b"\xff\xfe", b"\xfe\xff")
            else " (it looks binary)"
            if b"\x00" in raw[:8192]
            else ""
        )
        reason = f"not UTF-8 text{guess}: byte 0x{raw[exc.start]:02x} at offset {exc.start}"
        raise FileError(
            f"{where} is {reason}; ctxeval reads UTF-8: convert it (e.g. iconv -t UTF-8) or give another file", reason
        ) from None


def read_text(path: Path | str, what: str = "", max_bytes: int = MAX_TEXT_BYTES, binary_ok: bool = True) -> str:
    """A regular file as UTF-8 text. binary_ok=False refuses a file with NUL bytes in its first 8 KiB."""
    path = Path(path)
    raw = read_bytes(path, what, max_bytes)
    if not binary_ok and b"\x00" in raw[:8192] and raw[:2] not in (b"\xff\xfe", b"\xfe\xff"):  # UTF-16: decode says so
        raise FileError(
            f"{_describe(path, what)} is not a text file (binary content); give a UTF-8 text file", "binary content"
        )
    return decode(raw, _describe(path, what))


# -- JSON --------------------------------------------------------------------------------------------------------


class _NotFinite(ValueError):
    pass


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotFinite(text)
    return value


def _no_constant(name: str) -> float:
    raise _NotFinite(name)


def depth_of(value: Any, limit: int) -> int:
    """The nesting depth of a parsed JSON value (a scalar: 0), counted without recursion, stopping past `limit`."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            depth += 1
            deepest = max(deepest, depth)
            if deepest > limit:
                return deepest
            stack.extend((v, depth) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


class _Unreadable(ValueError):
    """Why a JSON text cannot be used: `reason` finishes '<where> ...'."""

    def __init__(self, reason: str, short: str) -> None:
        super().__init__(reason)
        self.reason, self.short = reason, short


def _parse(text: str, max_depth: int, finite: bool) -> Any:
    text = text[1:] if text.startswith("\ufeff") else text  # a UTF-8 byte-order mark some editors write
    try:
        value = json.loads(
            text, parse_constant=_no_constant if finite else None, parse_float=_finite_float if finite else None
        )
    except _NotFinite as exc:
        raise _Unreadable(
            f"holds the number {exc}, which is not finite; write a finite number", "a non-finite number"
        ) from None
    except json.JSONDecodeError as exc:
        raise _Unreadable(f"is not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})", "not JSON") from None
    except RecursionError:
        raise _Unreadable(
            f"is nested deeper than {max_depth} levels; not a file ctxeval reads", "nested too deep"
        ) from None
    except ValueError as exc:  # an integer of more than 4300 digits
        raise _Unreadable(
            f"is not JSON ctxeval can read ({str(exc).split(';')[0][:120]})", "a number too long to read"
        ) from None
    # a cheap bound first: the walk is needed only when there are more brackets than the limit
    if text.count("[") + text.count("{") > max_depth and depth_of(value, max_depth) > max_depth:
        raise _Unreadable(f"is nested deeper than {max_depth} levels; not a file ctxeval reads", "nested too deep")
    return value


def parse_json(text: str, where: str, max_depth: int = MAX_JSON_DEPTH, finite: bool = True) -> Any:
    """JSON text -> value; one line naming `where` for a syntax error, a value nested deeper than `max_depth`, an
    integer of thousands of digits, or (finite=True) NaN, Infinity and numbers too large for a float."""
    try:
        return _parse(text, max_depth, finite)
    except _Unreadable as exc:
        raise CtxevalError(f"{where} {exc.reason}") from None


def read_json(
    path: Path | str,
    what: str = "",
    max_bytes: int = MAX_SMALL_BYTES,
    max_depth: int = MAX_JSON_DEPTH,
    finite: bool = True,
) -> Any:
    """A JSON file (UTF-8, size, depth and finiteness checked), as parse_json."""
    path = Path(path)
    return parse_json(read_text(path, what, max_bytes), _describe(path, what), max_depth, finite)


def read_toml(path: Path | str, what: str = "", max_bytes: int = MAX_SMALL_BYTES) -> dict[str, Any]:
    """A TOML file (UTF-8, size checked); syntax errors, NaN and infinite values are one line."""
    path = Path(path)
    return parse_toml(read_text(path, what, max_bytes), _describe(path, what))


def parse_toml(text: str, where: str) -> dict[str, Any]:
    import tomllib

    try:
        data = tomllib.loads(text[1:] if text.startswith("\ufeff") else text)
    except tomllib.TOMLDecodeError as exc:
        raise CtxevalError(f"{where} is not valid TOML ({exc})") from None
    except RecursionError:
        raise CtxevalError(f"{where} is nested deeper than Python can parse; not a file ctxeval reads") from None
    bad = _non_finite_path(data)
    if bad is not None:
        raise CtxevalError(f"{where}: {bad} is not a finite number; write a finite number")
    if depth_of(data, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        raise CtxevalError(f"{where} is nested deeper than {MAX_JSON_DEPTH} levels; not a file ctxeval reads")
    return data


def _non_finite_path(value: Any, path: str = "") -> str | None:
    stack = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return where or "a value"
        if isinstance(item, dict):
            stack.extend((v, f"{where}.{k}" if where else str(k)) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((v, f"{where}[{i}]") for i, v in enumerate(item))
    return None


@dataclass
class JsonLines:
    """A JSON Lines file read line by line: the values of the good lines, and (line number, reason) for the others."""

    path: Path
    records: list[tuple[int, Any]] = field(default_factory=list)
    problems: list[tuple[int, str]] = field(default_factory=list)

    def objects(self) -> list[dict[str, Any]]:
        """The lines that hold JSON objects (the others are counted in `problems` by read_jsonl(objects=True))."""
        return [value for _, value in self.records if isinstance(value, dict)]

    def summary(self, limit: int = 3) -> str:
        """'line 3: not JSON; line 9: not a JSON object (+2 more)': the problems on one line."""
        shown = "; ".join(f"line {n}: {why}" for n, why in self.problems[:limit])
        more = len(self.problems) - limit
        return shown + (f" (+{more} more)" if more > 0 else "")


def parse_line(
    raw: bytes, objects: bool = True, max_depth: int = MAX_JSON_DEPTH, finite: bool = False
) -> tuple[Any, str | None]:
    """One JSON line -> (value, None), or (None, why it is not usable: 'not UTF-8', 'not JSON', ...)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None, "not UTF-8"
    try:
        value = _parse(text, max_depth, finite)
    except _Unreadable as exc:
        return None, exc.short
    if objects and not isinstance(value, dict):
        return None, f"not a JSON object (a {_json_kind(value)})"
    return value, None


def _json_kind(value: Any) -> str:
    return {list: "list", str: "string", bool: "boolean", type(None): "null", dict: "object"}.get(type(value), "number")


def read_jsonl(
    path: Path | str,
    what: str = "",
    max_bytes: int = MAX_TEXT_BYTES,
    objects: bool = True,
    max_depth: int = MAX_JSON_DEPTH,
    finite: bool = False,
) -> JsonLines:
    """Every non-blank line of a JSON Lines file, each decoded and parsed on its own (objects=True: a line that is
    not a JSON object is a problem too). A missing file reads as no lines."""
    path = Path(path)
    out = JsonLines(path)
    if not path.exists() and not path.is_symlink():
        return out
    raw = read_bytes(path, what, max_bytes)
    for number, line in enumerate(raw.split(b"\n"), 1):
        if not line.strip():
            continue
        value, why = parse_line(line, objects, max_depth, finite)
        if why is None:
            out.records.append((number, value))
        else:
            out.problems.append((number, why))
    return out


# -- writing -------------------------------------------------------------------------------------------------------


def _write_failed(target: Path, what: str, exc: OSError) -> CtxevalError:
    reason = exc.strerror or type(exc).__name__
    hint = "free some space and run the command again" if exc.errno in (28, 122) else "choose another path"
    return CtxevalError(f"cannot write {_describe(target, what)} ({reason}); {hint}")


@contextlib.contextmanager
def atomic_path(path: Path | str, what: str = "") -> Iterator[Path]:
    """A temporary path beside `path` to write to (by any library: savefig, to_csv); on success it replaces `path`
    in one rename, on failure it is removed. An OSError becomes one line naming the file. A target that is not a
    regular file (a device, a FIFO) is handed out as it is: it is written in place."""
    target = Path(path)
    if target.is_symlink():
        target = Path(os.path.realpath(target))  # replace the file the link points to, not the link
    try:
        info = target.stat()
    except OSError:
        info = None
    if info is not None and stat.S_ISDIR(info.st_mode):
        raise CtxevalError(f"cannot write {_describe(target, what)}: it is a directory; give a file path")
    if info is not None and not stat.S_ISREG(info.st_mode):
        try:
            yield target
        except OSError as exc:
            raise _write_failed(target, what, exc) from None
        return
    try:
        fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent or Path("."))
        os.close(fd)
    except OSError as exc:
        raise _write_failed(target, what, exc) from None
    tmp = Path(name)
    try:
        yield tmp
        if info is not None:
            with contextlib.suppress(OSError):
                os.chmod(tmp, stat.S_IMODE(info.st_mode))
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)  # what open() would have given a new file (mkstemp makes it 0600)
        os.replace(tmp, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise _write_failed(target, what, exc) from None
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def make_dirs(path: Path | str, what: str = "") -> Path:
    """mkdir -p, as one line naming the directory when it cannot be made."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CtxevalError(
            f"cannot create {_describe(path, what)} ({exc.strerror or type(exc).__name__}); choose "
            "another path or free some space"
        ) from None
    return path


def write_bytes(path: Path | str, data: bytes, what: str = "", durable: bool = False) -> Path:
    """Write `data` to `path` atomically (durable: fsync before the rename)."""
    with atomic_path(path, what) as tmp:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            if durable and stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                os.fsync(fh.fileno())
    return Path(path)


def write_text(path: Path | str, text: str, what: str = "", durable: bool = False) -> Path:
    """Write UTF-8 `text` to `path` atomically."""
    return write_bytes(path, text.encode("utf-8"), what, durable)


def finite_json(value: Any) -> Any:
    """A JSON-able copy of `value` with every NaN and infinite float as None (strict JSON has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value
