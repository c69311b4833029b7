"""util.paths.shown_path: a table or note names the home directory as ~, so committed results name no machine's
user (issue 39: a RULER table named /root/.cache/ctxeval/ruler-qa)."""

from pathlib import Path

from ctxeval.util.paths import shown_path


def test_paths_under_home_are_shown_from_tilde(monkeypatch, tmp_path):
    home = tmp_path / "alice"
    monkeypatch.setattr(Path, "home", classmethod(lambda cls: home))
    assert shown_path(home / ".cache" / "ctxeval" / "ruler-qa") == "~/.cache/ctxeval/ruler-qa"
    assert shown_path(home) == "~"
    assert shown_path(str(tmp_path / "alice2" / "x")) == str(tmp_path / "alice2" / "x")  # a sibling, not under home
    assert shown_path("/srv/data") == "/srv/data"
