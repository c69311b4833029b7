"""Tests for ctxeval.data.offline.

Most tests build their own R lazy-load database (Rdata.rdx + Rdata.rdb) with a small hand-written
R serializer, so they need neither R nor the Debian packages. The tests at the end read the real
packages and are skipped where they are not installed.
"""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os
import struct
import zlib
from pathlib import Path

import pytest

from ctxeval.data import offline as oc
from ctxeval.errors import CtxevalError

# --- a minimal R serializer (XDR, i.e. big-endian), enough for the objects a lazy-load db holds ---
# Each object: an int of flags (type in bits 0-7, "has attributes" bit 9, "has tag" bit 10,
# "levels" from bit 12 on: for CHARSXP the encoding, 8 = UTF-8, 64 = ASCII), then its payload.
NILVALUE, SYMSXP, LISTSXP, CHARSXP, LGLSXP, INTSXP, STRSXP, VECSXP = 254, 1, 2, 9, 10, 13, 16, 19
HAS_ATTR, HAS_TAG = 1 << 9, 1 << 10


def _i(*values: int) -> bytes:
    return struct.pack(f">{len(values)}i", *values)


def r_char(s: str | None) -> bytes:
    if s is None:  # NA_character_
        return _i(CHARSXP, -1)
    b = s.encode("utf-8")
    return _i(CHARSXP | ((64 if b.isascii() else 8) << 12), len(b)) + b


def _names_attr(names: list[str]) -> bytes:
    # attributes are a pairlist: one LISTSXP cell tagged with the symbol `names`, then NILVALUE
    return _i(LISTSXP | HAS_TAG) + _i(SYMSXP) + r_char("names") + r_str(names) + _i(NILVALUE)


def r_str(items: list[str | None], names: list[str] | None = None) -> bytes:
    head = _i(STRSXP | (HAS_ATTR if names else 0), len(items))
    return head + b"".join(r_char(s) for s in items) + (_names_attr(names) if names else b"")


def r_int(values: list[int]) -> bytes:
    return _i(INTSXP, len(values), *values)


def r_lgl(values: list[bool]) -> bytes:
    return _i(LGLSXP, len(values), *map(int, values))


def r_list(items: dict[str, bytes]) -> bytes:
    head = _i(VECSXP | (HAS_ATTR if items else 0), len(items))
    return head + b"".join(items.values()) + (_names_attr(list(items)) if items else b"")


def r_serialize(obj: bytes, version: int = 3, magic: bool = True) -> bytes:
    # header: format version, writer's R version (4.2.1), minimal reader version; v3 adds the encoding
    head = _i(version, 0x040201, 0x030500 if version == 3 else 0x020300)
    if version == 3:
        head += _i(5) + b"UTF-8"
    return (b"X\n" if magic else b"") + head + obj


def build_lazyload_db(
    data_dir: Path,
    objects: dict[str, bytes],
    *,
    version: int = 3,
    magic: bool = True,
    compressed: int = 1,
    blob_kind: bytes = b"Z",
    index_gzip: bool = True,
) -> None:
    """Write data_dir/Rdata.rdb and Rdata.rdx the way R's makeLazyLoadDB() does."""
    data_dir.mkdir(parents=True, exist_ok=True)
    rdb = bytearray()
    variables = {}
    for name, obj in objects.items():
        payload = r_serialize(obj, version, magic)
        if compressed == 1:
            blob = struct.pack(">I", len(payload)) + zlib.compress(payload)
        else:
            compress = {b"0": bytes, b"1": zlib.compress, b"2": bz2.compress, b"Z": lzma.compress}[blob_kind]
            blob = struct.pack(">I", len(payload)) + blob_kind + compress(payload)
        variables[name] = r_int([len(rdb), len(blob)])
        rdb += blob
    # `compressed` is TRUE for zlib databases, 2 for bzip2 and 3 for xz ones
    flag = r_lgl([True]) if compressed == 1 else r_int([compressed])
    index = r_list({"variables": r_list(variables), "references": r_list({}), "compressed": flag})
    raw_index = r_serialize(index, version, magic)
    (data_dir / "Rdata.rdb").write_bytes(bytes(rdb))
    (data_dir / "Rdata.rdx").write_bytes(gzip.compress(raw_index) if index_gzip else zlib.compress(raw_index))


AUSTEN_OBJECTS = ["emma", "mansfieldpark", "northangerabbey", "persuasion", "prideprejudice", "sensesensibility"]
AUSTEN_TITLES = [
    "Emma",
    "Mansfield Park",
    "Northanger Abbey",
    "Persuasion",
    "Pride and Prejudice",
    "Sense and Sensibility",
]
FAKE_MOBY = (
    "\ufeffThe Project Gutenberg EBook of Moby Dick\r\n\r\n"
    "*** START OF THIS PROJECT GUTENBERG EBOOK MOBY DICK ***\r\n\r\n"
    "Call me Ishmael.\r\nSome years ago.\r\n\r\n"
    "*** END OF THIS PROJECT GUTENBERG EBOOK MOBY DICK ***\r\nLicense text.\r\n"
)


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """Every test: a tmp cache, no user R library, and no system R libraries."""
    monkeypatch.setenv("CTXEVAL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("CTXEVAL_R_LIBRARY", raising=False)
    monkeypatch.setattr(oc, "_SYSTEM_R_LIBRARIES", ())


@pytest.fixture
def fake_library(tmp_path, monkeypatch) -> Path:
    """An R library with small janeaustenr and tokenizers packages, on $CTXEVAL_R_LIBRARY."""
    lib = tmp_path / "Rlib"
    novels = {obj: r_str(["", f"  {obj.upper()}", "", "Chapter 1", f"Text of {obj}.", ""]) for obj in AUSTEN_OBJECTS}
    novels = dict(reversed(list(novels.items())))  # db order must not matter
    build_lazyload_db(lib / "janeaustenr" / "data", novels)
    build_lazyload_db(lib / "tokenizers" / "data", {"mobydick": r_str([FAKE_MOBY])})
    monkeypatch.setenv("CTXEVAL_R_LIBRARY", f"{tmp_path / 'empty'}{os.pathsep}{lib}")
    return lib


# --- the lazy-load framing ---


@pytest.mark.parametrize(
    "options",
    [
        {},  # what R writes: v3, "X\n", zlib values, gzip index
        {"version": 2, "index_gzip": False},
        {"magic": False},  # no "X\n" format line
        {"compressed": 3, "blob_kind": b"Z"},  # xz database
        {"compressed": 2, "blob_kind": b"2"},  # bzip2 database
        {"compressed": 3, "blob_kind": b"0"},  # stored uncompressed inside a v3 database
    ],
    ids=["r-default", "v2-zlib-index", "no-magic", "xz", "bzip2", "stored"],
)
def test_reader_roundtrip(tmp_path, options):
    build_lazyload_db(
        tmp_path / "data",
        {"alpha": r_str(["first line", "caf\u00e9 \u2014 na\u00efve", None, ""]), "beta": r_str(["b"])},
        **options,
    )
    objects = oc.read_rdata_objects(tmp_path / "data")
    assert list(objects) == ["alpha", "beta"]
    assert list(objects["alpha"]) == ["first line", "caf\u00e9 \u2014 na\u00efve", None, ""]
    assert list(objects["beta"]) == ["b"]


def test_reader_selects_names_and_reports_missing_ones(tmp_path):
    build_lazyload_db(tmp_path / "data", {"alpha": r_str(["a"]), "beta": r_str(["b"])})
    assert list(oc.read_rdata_objects(tmp_path / "data", ["beta"])) == ["beta"]
    with pytest.raises(CtxevalError, match="no object gamma"):
        oc.read_rdata_objects(tmp_path / "data", ["gamma"])


def test_reader_corrupt_files_name_the_file(tmp_path):
    data = tmp_path / "data"
    build_lazyload_db(data, {"alpha": r_str(["a" * 1000])})
    rdb = (data / "Rdata.rdb").read_bytes()
    (data / "Rdata.rdb").write_bytes(rdb[: len(rdb) // 2])  # truncated value
    with pytest.raises(CtxevalError, match="Rdata.rdb is corrupt") as info:
        oc.read_rdata_objects(data)
    assert "\n" not in str(info.value)
    (data / "Rdata.rdx").write_bytes(b"not compressed at all")
    with pytest.raises(CtxevalError, match="Rdata.rdx is corrupt"):
        oc.read_rdata_objects(data)
    (data / "Rdata.rdx").write_bytes(gzip.compress(b"X\n" + b"\x00\x00\x00\x03 garbage"))
    with pytest.raises(CtxevalError, match="Rdata.rdx is corrupt"):
        oc.read_rdata_objects(data)


# --- named corpora on a fake library ---


def test_load_fake_austen_and_mobydick(fake_library):
    austen = oc.load_named_corpus("austen")
    assert [title for title, _ in austen] == AUSTEN_TITLES
    assert austen[0][1] == "EMMA\n\nChapter 1\nText of emma."  # lines joined, whole text stripped
    [(title, text)] = oc.load_named_corpus("mobydick")
    assert title == "Moby Dick"
    assert text == "Call me Ishmael.\nSome years ago."


def test_gutenberg_markers_missing_keeps_whole_text():
    assert oc._strip_gutenberg("no\nmarkers here") == "no\nmarkers here"
    assert oc._strip_gutenberg("head\n*** START OF X ***\nbody") == "body"
    assert oc._strip_gutenberg("body\n*** END OF X ***\nlicense") == "body"


def test_second_load_comes_from_cache(fake_library, monkeypatch):
    first = oc.load_named_corpus("austen")
    folder = oc.cache_dir() / "corpora" / "austen"
    index = json.loads((folder / "index.json").read_text(encoding="utf-8"))
    assert index["titles"] == AUSTEN_TITLES
    assert index["source"] == str(fake_library / "janeaustenr" / "data" / "Rdata.rdb")
    assert (folder / "emma.txt").read_text(encoding="utf-8") == first[0][1]

    def fail(*args, **kwargs):
        raise AssertionError("the R database was read again")

    monkeypatch.setattr(oc, "read_rdata_objects", fail)
    assert oc.load_named_corpus("austen") == first


def test_cache_is_invalidated_when_the_rdb_changes(fake_library, monkeypatch):
    oc.load_named_corpus("austen")
    rdb = fake_library / "janeaustenr" / "data" / "Rdata.rdb"
    st = rdb.stat()
    os.utime(rdb, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    calls = []
    real = oc.read_rdata_objects
    monkeypatch.setattr(oc, "read_rdata_objects", lambda *a: calls.append(a) or real(*a))
    assert [t for t, _ in oc.load_named_corpus("austen")] == AUSTEN_TITLES
    assert len(calls) == 1


def test_missing_package_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("CTXEVAL_R_LIBRARY", str(tmp_path / "nothing-here"))
    with pytest.raises(CtxevalError) as info:
        oc.load_named_corpus("austen")
    message = str(info.value)
    assert "sudo apt-get install r-cran-janeaustenr" in message
    debs = tmp_path / "cache" / "debs"
    deb = "r-cran-janeaustenr"
    assert f"'mkdir -p {debs} && apt-get download {deb} && dpkg-deb -x {deb}_*.deb {debs}'" in message
    assert "\n" not in message
    with pytest.raises(CtxevalError, match="apt-get download r-cran-tokenizers"):
        oc.load_named_corpus("mobydick")


def test_package_extracted_into_the_cache_is_found(tmp_path):
    # what the error message tells users without root to do: dpkg-deb -x ... <cache>/debs
    site = oc.cache_dir() / "debs" / "usr" / "lib" / "R" / "site-library"
    build_lazyload_db(site / "tokenizers" / "data", {"mobydick": r_str([FAKE_MOBY])})
    assert oc.load_named_corpus("mobydick")[0][1].startswith("Call me Ishmael.")


def test_unknown_corpus_lists_the_valid_names():
    with pytest.raises(CtxevalError, match="unknown corpus 'shakespeare'.*austen, mobydick"):
        oc.load_named_corpus("shakespeare")
    assert set(oc.NAMED_CORPORA) == {"austen", "mobydick"}


def test_cache_dir_rule(monkeypatch, tmp_path):
    assert oc.cache_dir() == tmp_path / "cache"
    monkeypatch.delenv("CTXEVAL_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert oc.cache_dir() == tmp_path / "xdg" / "ctxeval"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert oc.cache_dir() == tmp_path / "home" / ".cache" / "ctxeval"


# --- the real Debian packages, where installed ---


def _installed_library(package: str) -> Path | None:
    env = [Path(p) for p in os.environ.get("CTXEVAL_R_LIBRARY", "").split(os.pathsep) if p]
    default_cache = Path(os.environ.get("CTXEVAL_CACHE") or Path.home() / ".cache" / "ctxeval")
    for lib in [*env, default_cache / "debs/usr/lib/R/site-library", *oc._SYSTEM_R_LIBRARIES]:
        if (lib / package / "data" / "Rdata.rdb").is_file():
            return lib
    return None


JANEAUSTENR = _installed_library("janeaustenr")
TOKENIZERS = _installed_library("tokenizers")


@pytest.mark.skipif(JANEAUSTENR is None, reason="Debian package r-cran-janeaustenr is not installed")
def test_real_austen(monkeypatch):
    monkeypatch.setenv("CTXEVAL_R_LIBRARY", str(JANEAUSTENR))
    docs = oc.load_named_corpus("austen")
    assert [title for title, _ in docs] == AUSTEN_TITLES == sorted(AUSTEN_TITLES)
    assert all(len(text) > 300_000 for _, text in docs)
    assert docs[0][1].startswith("EMMA\n\nBy Jane Austen")
    assert docs[4][1].startswith("PRIDE AND PREJUDICE")
    assert oc.load_named_corpus("austen") == docs  # from the cache this time


@pytest.mark.skipif(TOKENIZERS is None, reason="Debian package r-cran-tokenizers is not installed")
def test_real_mobydick(monkeypatch):
    monkeypatch.setenv("CTXEVAL_R_LIBRARY", str(TOKENIZERS))
    [(title, text)] = oc.load_named_corpus("mobydick")
    assert title == "Moby Dick"
    assert len(text) > 1_000_000
    assert "Project Gutenberg EBook of" not in text[:1000]
    assert "*** START OF" not in text and "*** END OF" not in text
    assert "MOBY DICK; OR THE WHALE" in text[:200]
    assert "Call me Ishmael." in text
    assert "\r" not in text
