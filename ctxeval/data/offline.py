"""Named offline corpora of long English prose, read from Debian's R data packages.

None of the text lives in this repository. It is read at run time from R packages that
Debian ships (public-domain Project Gutenberg texts):

- ``austen``: the six Jane Austen novels in ``r-cran-janeaustenr`` (R package janeaustenr,
  one character vector of lines per novel), as six documents in alphabetical title order.
- ``mobydick``: Melville's Moby Dick in ``r-cran-tokenizers`` (R dataset ``tokenizers::mobydick``,
  Gutenberg EBook #2701 as one string), one document with the Gutenberg header and footer cut off.

and one corpus every Python install has:

- ``pydoc``: CPython's bundled documentation topics (``pydoc_data.topics``), the part held out from the bundled
  tiny model's training (the split is defined at the end of this module; ctxeval/tiny/corpus.py trains on the rest).

An R package keeps its datasets in a lazy-load database: ``<pkg>/data/Rdata.rdx`` (a compressed,
serialized R list indexing the objects) and ``Rdata.rdb`` (the objects, each one compressed on its
own). This module undoes only that framing; R's serialization format itself is parsed by the PyPI
package ``rdata``. Extracted text is cached as UTF-8 files under ``cache_dir()/corpora/<name>/``.
"""

from __future__ import annotations

import bz2
import functools
import gzip
import json
import lzma
import os
import re
import shlex
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

from ..errors import CtxevalError
from ..util.paths import cache_dir
from ..util.textfiles import read_json, write_text

NAMED_CORPORA: dict[str, str] = {
    "austen": "Jane Austen's six novels, 6 documents of 0.43-0.88M characters (Debian package r-cran-janeaustenr)",
    "mobydick": "Herman Melville's Moby Dick, 1 document of 1.2M characters without the Gutenberg "
    "header/footer (Debian package r-cran-tokenizers)",
}


@dataclass(frozen=True)
class _Source:
    package: str  # directory name of the R package in an R library
    deb: str  # Debian package that installs it
    objects: tuple[tuple[str, str], ...]  # (R object name, document title), in corpus order
    gutenberg: bool  # cut the Project Gutenberg header and footer


_SOURCES: dict[str, _Source] = {
    "austen": _Source(
        "janeaustenr",
        "r-cran-janeaustenr",
        (
            ("emma", "Emma"),
            ("mansfieldpark", "Mansfield Park"),
            ("northangerabbey", "Northanger Abbey"),
            ("persuasion", "Persuasion"),
            ("prideprejudice", "Pride and Prejudice"),
            ("sensesensibility", "Sense and Sensibility"),
        ),
        gutenberg=False,
    ),
    "mobydick": _Source("tokenizers", "r-cran-tokenizers", (("mobydick", "Moby Dick"),), gutenberg=True),
}

# Searched after $CTXEVAL_R_LIBRARY and the user cache; a module constant so tests can replace it.
_SYSTEM_R_LIBRARIES: tuple[Path, ...] = (
    Path("/usr/lib/R/site-library"),
    Path("/usr/local/lib/R/site-library"),
    Path("/usr/lib/R/library"),
)
_CACHE_FORMAT = 1
_GUTENBERG_START = re.compile(r"\*\*\*\s*START OF", re.IGNORECASE)
_GUTENBERG_END = re.compile(r"\*\*\*\s*END OF", re.IGNORECASE)


def load_named_corpus(name: str) -> list[tuple[str, str]]:
    """Return the corpus ``name`` as ``[(title, text), ...]`` in corpus order (see ``NAMED_CORPORA``)."""
    source = _SOURCES.get(name)
    if source is None:
        raise CtxevalError(f"unknown corpus {name!r}: use one of {', '.join(sorted(NAMED_CORPORA))}")
    data_dir = _find_package_data(name, source)
    rdb = (data_dir / "Rdata.rdb").absolute()
    st = rdb.stat()
    stamp = {"source": str(rdb), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    folder = cache_dir() / "corpora" / name
    docs = _read_cache(folder, stamp)
    if docs is None:
        objects = read_rdata_objects(data_dir, [obj for obj, _ in source.objects])
        docs = [(title, _to_text(objects[obj], source.gutenberg, f"{obj} in {rdb}")) for obj, title in source.objects]
        files = [f"{obj}.txt" for obj, _ in source.objects]
        _write_cache(folder, stamp, [(title, file, text) for file, (title, text) in zip(files, docs)])
    return docs


def check_named_corpus(name: str) -> None:
    """Fail now, with load_named_corpus's line, when the corpus ``name`` cannot be read (unknown name, or its Debian
    package not installed): a look for two files, nothing is read (commands call it before loading a model)."""
    source = _SOURCES.get(name)
    if source is None:
        raise CtxevalError(f"unknown corpus {name!r}: use one of {', '.join(sorted(NAMED_CORPORA))}")
    _find_package_data(name, source)


def read_rdata_objects(pkg_data_dir: Path, names: list[str] | None = None) -> dict[str, object]:
    """Read objects (all, or those in ``names``) from the R lazy-load database in ``pkg_data_dir``.

    Values are what ``rdata.conversion.convert`` makes of them; a character vector becomes a numpy
    array of ``str`` (``None`` for NA). Raises CtxevalError naming the file when it is unreadable.
    """
    rdx, rdb = Path(pkg_data_dir) / "Rdata.rdx", Path(pkg_data_dir) / "Rdata.rdb"
    raw = _read_bytes(rdx)
    try:  # R writes the index with saveRDS(), i.e. gzip; accept a bare zlib stream too
        index_bytes = zlib.decompress(raw)
    except zlib.error:
        try:
            index_bytes = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as e:
            raise _corrupt(rdx, e) from e
    index = _unserialize(index_bytes, rdx)
    try:
        variables = {str(k): (int(v[0]), int(v[1])) for k, v in index["variables"].items()}
        compressed = int(index["compressed"][0])
    except (KeyError, TypeError, IndexError, ValueError, AttributeError) as e:
        raise _corrupt(rdx, e) from e
    wanted = list(variables) if names is None else list(names)
    missing = [n for n in wanted if n not in variables]
    if missing:
        raise CtxevalError(
            f"{rdx} has no object {', '.join(missing)} (it has {', '.join(variables) or 'none'}): "
            "reinstall the Debian package that owns it"
        )
    out: dict[str, object] = {}
    try:
        with open(rdb, "rb") as f:
            for n in wanted:
                offset, length = variables[n]
                f.seek(offset)
                blob = f.read(length)
                try:
                    payload = _decompress_blob(blob, compressed)
                except (ValueError, struct.error, zlib.error, OSError, EOFError, lzma.LZMAError) as e:
                    raise _corrupt(rdb, e) from e
                out[n] = _unserialize(payload, rdb)
    except OSError as e:
        raise _unreadable(rdb, e) from e
    return out


def _decompress_blob(blob: bytes, compressed: int) -> bytes:
    """One value of an .rdb: what R's lazyLoadDBfetch() undoes before unserialize()."""
    if compressed == 0:  # makeLazyLoadDB(compress = FALSE): the serialized bytes as they are
        return blob
    if len(blob) < 4:
        raise ValueError(f"value of {len(blob)} bytes is shorter than its 4-byte length header")
    (length,) = struct.unpack(">I", blob[:4])  # uncompressed length, big-endian
    if compressed in (2, 3):  # bzip2/xz databases: a type byte follows the length
        kind, body = blob[4:5], blob[5:]
        decoders = {b"0": bytes, b"1": zlib.decompress, b"2": bz2.decompress, b"Z": lzma.decompress}
        if kind not in decoders:
            raise ValueError(f"unknown compression type {kind!r}")
        data = decoders[kind](body)
    else:  # compressed = TRUE (what our packages use): a zlib stream
        data = zlib.decompress(blob[4:])
    if len(data) != length:
        raise ValueError(f"decompressed to {len(data)} bytes, header says {length}")
    return data


def _unserialize(data: bytes, where: Path) -> object:
    import rdata  # imported here: only corpus loading needs it

    # R's serialize() starts with a format line ("X\n" = XDR), and rdata refuses data without one
    # ("Unknown file format"). Both Debian packages have it, but a stream that starts straight at
    # the XDR version integer (format 2 or 3) is the same data, so put the line back.
    if data[:4] in (b"\x00\x00\x00\x02", b"\x00\x00\x00\x03"):
        data = b"X\n" + data
    try:
        # extension=".rds": a bare serialized object (no RDX2 header), which silences rdata's warning
        return rdata.conversion.convert(rdata.parser.parse_data(data, extension=".rds"))
    except Exception as e:  # rdata raises many kinds (ValueError, NotImplementedError, KeyError, ...)
        raise _corrupt(where, e) from e


def _corrupt(path: Path, error: BaseException) -> CtxevalError:
    detail = f"{type(error).__name__}: {error}"[:160]
    return CtxevalError(
        f"{path} is corrupt or not an R lazy-load database ({detail}): reinstall the Debian package that owns it"
    )


def _unreadable(path: Path, error: OSError) -> CtxevalError:
    return CtxevalError(f"cannot read {path} ({error.strerror}): check its permissions or reinstall its package")


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise _unreadable(path, e) from e


def _library_dirs() -> list[Path]:
    env = os.environ.get("CTXEVAL_R_LIBRARY", "")
    dirs = [Path(p).expanduser() for p in env.split(os.pathsep) if p]
    dirs.append(cache_dir() / "debs" / "usr" / "lib" / "R" / "site-library")
    return dirs + list(_SYSTEM_R_LIBRARIES)


def _find_package_data(name: str, source: _Source) -> Path:
    for lib in _library_dirs():
        data = lib / source.package / "data"
        if (data / "Rdata.rdx").is_file() and (data / "Rdata.rdb").is_file():
            return data
    debs = shlex.quote(str(cache_dir() / "debs"))  # dpkg-deb -x creates only the last directory: mkdir -p
    raise CtxevalError(
        f"corpus {name!r} needs the Debian package {source.deb}: run 'sudo apt-get install {source.deb}', "
        f"or without root 'mkdir -p {debs} && apt-get download {source.deb} && dpkg-deb -x {source.deb}_*.deb {debs}' "
        f"(or set CTXEVAL_R_LIBRARY to an R library that contains {source.package})"
    )


def _to_text(value: object, gutenberg: bool, where: str) -> str:
    if getattr(value, "dtype", None) is None or value.dtype.kind not in "UO":  # type: ignore[attr-defined]
        raise CtxevalError(f"{where} is not a character vector: reinstall the Debian package that owns it")
    text = "\n".join("" if line is None else str(line) for line in value)  # type: ignore[attr-defined]
    text = text.replace("\r\n", "\n").replace("\r", "\n").removeprefix("\ufeff")
    if gutenberg:
        text = _strip_gutenberg(text)
    return text.strip()


def _strip_gutenberg(text: str) -> str:
    """Keep what lies between the '*** START OF' and '*** END OF' lines (each cut only if found)."""
    lines = text.split("\n")
    start = next((i for i, line in enumerate(lines) if _GUTENBERG_START.search(line)), -1)
    end = next((i for i in range(start + 1, len(lines)) if _GUTENBERG_END.search(lines[i])), len(lines))
    return "\n".join(lines[start + 1 : end])


def _read_cache(folder: Path, stamp: dict[str, object]) -> list[tuple[str, str]] | None:
    try:
        index = read_json(folder / "index.json", "corpus cache index")
        if index.get("format") != _CACHE_FORMAT or any(index.get(k) != v for k, v in stamp.items()):
            return None
        return [
            (str(title), (folder / file).read_bytes().decode("utf-8"))
            for title, file in zip(index["titles"], index["files"], strict=True)
        ]
    except (OSError, ValueError, KeyError, TypeError, AttributeError, CtxevalError):
        return None  # no cache, a stale one or a damaged one: read the package again


def _write_cache(folder: Path, stamp: dict[str, object], docs: list[tuple[str, str, str]]) -> None:
    """Write the texts, then the index (last, so a half-written cache is never read)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for _, file, text in docs:
            _atomic_write(folder / file, text)
        titles, files = [d[0] for d in docs], [d[1] for d in docs]
        index = {"format": _CACHE_FORMAT, **stamp, "titles": titles, "files": files}
        _atomic_write(folder / "index.json", json.dumps(index, indent=2) + "\n")
    except (OSError, CtxevalError):
        pass  # an unwritable cache costs only speed: the next call reads the package again


def _atomic_write(path: Path, text: str) -> None:
    write_text(path, text, "corpus cache file")


# ---------------------------------------------------------------------------------------------------------------
# pydoc: CPython's bundled documentation, split into the tiny model's training and held-out topics

# every 4th pydoc topic by length in CPython 3.11 (index 0, 4, 8, ... of the topics sorted longest first)
HELD_OUT_TITLES: tuple[str, ...] = (
    "specialnames",
    "string-methods",
    "customization",
    "execmodel",
    "operator-summary",
    "naming",
    "objects",
    "with",
    "dict",
    "context-managers",
    "global",
    "power",
    "typesmodules",
    "floating",
    "bitwise",
    "while",
    "if",
    "break",
    "numbers",
    "bltin-null-object",
)
MIN_DEDUP_LINE = 12  # training lines at least this long (stripped) that occur in held-out text are removed
_CONTAINED = 0.5  # a held-out topic with more than this share of its lines inside a longer one is not a document


def pydoc_topics() -> dict[str, str]:
    from pydoc_data.topics import topics

    return dict(topics)


def _lines(text: str, minimum: int = MIN_DEDUP_LINE) -> set[str]:
    return {s for s in (line.strip() for line in text.splitlines()) if len(s) >= minimum}


@functools.lru_cache(maxsize=1)
def _held_out_lines() -> frozenset[str]:
    topics = pydoc_topics()
    out: set[str] = set()
    for title in HELD_OUT_TITLES:
        if title in topics:
            out |= _lines(topics[title])
    return frozenset(out)


def remove_held_out_lines(text: str) -> str:
    """The text without any line (stripped, >= 12 characters) that also occurs in a held-out topic."""
    banned = _held_out_lines()
    kept = [line for line in text.splitlines() if line.strip() not in banned or len(line.strip()) < MIN_DEDUP_LINE]
    return "\n".join(kept)


def held_out_documents() -> list[tuple[str, str]]:
    """(title, text) of the held-out pydoc topics, longest first (ties by title); never trained on.

    A held-out topic whose lines are mostly inside a longer held-out topic is left out (its text is evaluated as
    part of the longer one)."""
    topics = pydoc_topics()
    present = sorted((t for t in HELD_OUT_TITLES if t in topics), key=lambda t: (-len(topics[t]), t))
    docs: list[tuple[str, str]] = []
    for title in present:
        own = _lines(topics[title], 20)
        inside = max((len(own & _lines(text, 20)) for _, text in docs), default=0)
        if own and inside / len(own) > _CONTAINED:
            continue
        docs.append((title, topics[title]))
    return docs
