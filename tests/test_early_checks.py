"""Issue 26: a data spec that cannot be read fails before the model loads (ppl, needle, passkey, entropy, ruler),
and `ctxeval --version`."""

from importlib.metadata import version

import pytest
from typer.testing import CliRunner

from ctxeval.cli import app, run
from ctxeval.data import corpora
from ctxeval.data import offline as oc
from ctxeval.errors import CtxevalError

runner = CliRunner()


@pytest.fixture
def no_model(monkeypatch, tmp_path):
    """Loading a model fails the test loudly; no offline corpus package is installed; the cache is empty."""

    def load(*args, **kwargs):
        raise AssertionError("the model was loaded before the data spec was checked")

    monkeypatch.setattr(run, "load_for", load)  # every measuring command loads through cli/run.py's recipe
    monkeypatch.setenv("CTXEVAL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CTXEVAL_R_LIBRARY", str(tmp_path / "no-r-library"))
    monkeypatch.setattr(oc, "_SYSTEM_R_LIBRARIES", ())
    monkeypatch.chdir(tmp_path)
    return tmp_path


CASES = {
    "ppl, corpus package missing": (
        ["ppl", "--model", "smollm2", "--data", "austen", "--lengths", "1k"],
        "needs the Debian package r-cran-janeaustenr",
    ),
    "ppl, no such file": (["ppl", "--model", "tiny", "--data", "missing.txt"], "--data 'missing.txt': no such file"),
    "ppl, glob matches nothing": (["ppl", "--model", "tiny", "--data", "nowhere/*.txt"], "matches no files"),
    "ppl, hf without a name": (["ppl", "--model", "tiny", "--data", "hf:@test"], "write hf:NAME[:CONFIG][@SPLIT]"),
    "ppl, unsupported file": (["ppl", "--model", "tiny", "--data", "book.pdf"], "unsupported file type '.pdf'"),
    "ppl, empty records": (["ppl", "--model", "tiny", "--data", "empty.jsonl"], "is empty"),
    "needle haystack": (["needle", "--model", "tiny", "--haystack", "mobydick"], "r-cran-tokenizers"),
    "passkey haystack": (
        ["passkey", "--model", "tiny", "--protocol", "ctxeval", "--haystack", "missing.txt"],
        "--haystack 'missing.txt': no such file",
    ),
    "entropy data": (["entropy", "--model", "tiny", "--data", "austen"], "r-cran-janeaustenr"),
    "ruler essay substitute": (
        ["ruler", "--model", "tiny", "--tasks", "niah_single_2", "--essay-substitute", "austen"],
        "r-cran-janeaustenr",
    ),
    "ruler essays": (
        ["ruler", "--model", "tiny", "--tasks", "niah_single_2", "--essays", "missing.json"],
        "--essays missing.json",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_data_spec_that_cannot_be_read_fails_before_the_model_loads(no_model, case):
    (no_model / "book.pdf").write_bytes(b"%PDF")
    (no_model / "empty.jsonl").write_text("")
    args, fragment = CASES[case]
    result = runner.invoke(app, args)
    assert not isinstance(result.exception, AssertionError), "the model was loaded first"
    assert result.exit_code == 2, result.output
    assert fragment in result.stderr and result.stderr.startswith("error:")
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.output
    assert not (no_model / "runs").exists()


def test_check_data_spec_accepts_what_can_be_read_and_reads_nothing(no_model, monkeypatch):
    (no_model / "a.txt").write_text("text")
    (no_model / "b.jsonl").write_text('{"text": "x"}\n')
    monkeypatch.setattr(corpora, "iter_documents", lambda *a, **k: pytest.fail("check_data_spec read the corpus"))
    monkeypatch.setattr(oc, "load_named_corpus", lambda *a, **k: pytest.fail("check_data_spec read the corpus"))
    for spec in ("pydoc", "a.txt", "b.jsonl", str(no_model), "*.txt", "hf:emozilla/pg19-test@test", "hf:name:cfg"):
        corpora.check_data_spec(spec)
    with pytest.raises(CtxevalError, match="--haystack 'nope'"):
        corpora.check_data_spec("nope", "--haystack")


def test_version_prints_the_installed_distribution():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"ctxeval {version('ctxeval')}\n"
