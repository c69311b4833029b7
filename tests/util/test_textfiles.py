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
