"""util/textfiles.py: writing files safely."""

import pytest

from ctxeval.errors import CtxevalError
from ctxeval.util import textfiles


def test_atomic_writes_leave_the_old_file_when_the_write_fails(tmp_path, monkeypatch):
    path = tmp_path / "table.md"
    path.write_text("old\n")

    def full(*_):
        raise OSError(28, "No space left on device")

    with pytest.raises(CtxevalError, match="cannot write report file .* free some space"):
        with textfiles.atomic_path(path, "report file") as tmp:
            tmp.write_text("half of the ne")
            full()
    assert path.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["table.md"]
    textfiles.write_text(path, "new\n")
    assert path.read_text() == "new\n" and oct(path.stat().st_mode & 0o777) != "0o600"


LIMIT = 64  # bytes: every reader takes max_bytes


def exactly(size: int, kind: str) -> str:
    """Valid content of exactly `size` bytes for a reader of `kind`."""
    if kind == "json":
        return '"' + "a" * (size - 2) + '"'
    if kind == "jsonl":
        return '{"a": "' + "a" * (size - 10) + '"}\n'
    if kind == "toml":
        return 'a = "' + "a" * (size - 7) + '"\n'
    return "a" * size


@pytest.mark.parametrize("kind", ["bytes", "text", "json", "jsonl", "toml"])
def test_a_file_at_its_limit_is_read_whole_and_one_byte_past_it_is_refused(tmp_path, kind):
    """Bugs caught: the file read to max_bytes and the rest cut silently (read(max_bytes) instead of
    read(max_bytes + 1): nothing can be seen past the limit), or the limit itself refused (>= for >)."""
    readers = {
        "bytes": textfiles.read_bytes,
        "text": textfiles.read_text,
        "json": textfiles.read_json,
        "jsonl": textfiles.read_jsonl,
        "toml": textfiles.read_toml,
    }
    path = tmp_path / f"file.{kind}"
    path.write_text(exactly(LIMIT, kind))
    assert path.stat().st_size == LIMIT
    got = readers[kind](path, "the file", max_bytes=LIMIT)
    whole = {
        "bytes": path.read_bytes(),
        "text": path.read_text(),
        "json": "a" * (LIMIT - 2),
        "toml": {"a": "a" * (LIMIT - 7)},
    }
    if kind == "jsonl":
        assert got.objects() == [{"a": "a" * (LIMIT - 10)}]
    else:
        assert got == whole[kind]
    path.write_text(exactly(LIMIT + 1, kind))
    with pytest.raises(CtxevalError, match=r"^the file .* is larger than 64 bytes, more than ctxeval reads"):
        readers[kind](path, "the file", max_bytes=LIMIT)
