"""Issue 26: a data spec that cannot be read fails before the model loads (ppl, needle, passkey, entropy, ruler),
and `ctxeval --version`."""

from __future__ import annotations

import json
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


# Issue 26, item 2: a method named without a factor measures something. Static methods whose factor defaults to 1
# get the factor that covers the longest length asked (longest / trained, shown in the label); a method that stays
# plain RoPE at the lengths asked is named in a note; an unknown name gets the nearest one.


def run_cli(tmp_path, *args):
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return result


def test_ppl_rows_differ_from_none_when_methods_are_named_bare(tmp_path):
    out = tmp_path / "run"
    result = run_cli(
        tmp_path,
        "ppl",
        "--model",
        "tiny",
        "--lengths",
        "64,256",
        "-m",
        "none",
        "-m",
        "yarn",
        "-m",
        "pi",
        "--docs",
        "1",
        "--out",
        str(out),
    )
    assert result.exit_code == 0, result.output
    assert "yarn, pi: factor 2 = the longest length 256 / the trained length 128" in result.stderr
    run = json.loads((out / "run.json").read_text())
    assert run["spec"]["methods"] == ["none", "yarn(factor=2)", "pi(factor=2)"]
    table = (out / "table.md").read_text()
    rows = {
        line.split("|")[1].strip(): line.split("|")[2:-1]
        for line in table.splitlines()
        if line.startswith("| ") and "factor" in line or line.startswith("| none")
    }
    assert rows["yarn(factor=2)"] != rows["none"] and rows["pi(factor=2)"] != rows["none"]


def test_ppl_within_the_trained_length_warns_that_bare_methods_are_plain(tmp_path):
    result = run_cli(
        tmp_path,
        "ppl",
        "--model",
        "tiny",
        "--lengths",
        "64",
        "-m",
        "none",
        "-m",
        "yarn",
        "--docs",
        "1",
        "--out",
        str(tmp_path / "run"),
    )
    assert result.exit_code == 0, result.output
    assert "note: yarn(factor=1) is plain RoPE at this factor: it measures the same as none" in result.stderr


def test_passkey_labels_carry_the_default_factor(tmp_path):
    out = tmp_path / "run"
    result = run_cli(
        tmp_path,
        "passkey",
        "--model",
        "tiny",
        "--lengths",
        "256",
        "--samples",
        "1",
        "-m",
        "yarn",
        "--protocol",
        "ctxeval",
        "--out",
        str(out),
    )
    assert result.exit_code == 0, result.output
    assert json.loads((out / "run.json").read_text())["spec"]["methods"] == ["yarn(factor=2)"]


def test_an_unknown_name_suggests_the_nearest_of_both_kinds(tmp_path):
    result = run_cli(tmp_path, "ppl", "--model", "tiny", "-m", "yarn+log-n")
    assert result.exit_code == 2
    assert "unknown method 'log-n' in 'yarn+log-n'; did you mean 'logn'?" in result.stderr
    assert "self-extend, rerope, leaky-rerope, logn" in result.stderr


def test_methods_lists_which_factors_default_to_the_longest_length(tmp_path):
    result = run_cli(tmp_path, "methods", "--format", "json")
    factors = {m["name"]: p for m in json.loads(result.stdout) for p in m["params"] if p["name"] == "factor"}
    with_rule = sorted(name for name, p in factors.items() if "measuring_default" in p)
    assert with_rule == ["ntk", "ntk-by-parts", "ntk-mixed", "pi", "yarn"]


def test_plan_takes_the_default_factor_from_length(tmp_path):
    geometry = ["--head-dim", "64", "--base", "10000", "--original-length", "4096", "--format", "json"]
    result = run_cli(tmp_path, "plan", "-m", "yarn", *geometry, "--length", "16384")
    assert json.loads(result.stdout)["params"]["factor"] == 4
    assert "factor 4 = the longest length 16,384 / the trained length 4,096" in result.stderr
    bare = run_cli(tmp_path, "plan", "-m", "yarn", *geometry)
    assert json.loads(bare.stdout)["params"]["factor"] == 1 and "yarn is plain RoPE at this factor" in bare.stderr


# -- issue 39: the run directory (the same command resumes; refusals before the load; nothing measured, nothing left)


def ppl_in(cwd, monkeypatch, *extra):
    monkeypatch.chdir(cwd)
    args = ["ppl", "--model", "tiny", "--lengths", "64,128", "-m", "none", "--docs", "1", *extra]
    return CliRunner().invoke(app, args, catch_exceptions=False)


def test_the_same_command_twice_resumes_its_default_directory(tmp_path, monkeypatch):
    first = ppl_in(tmp_path, monkeypatch)
    assert first.exit_code == 0, first.output
    assert "2 points measured, 0 reused" in first.stderr
    again = ppl_in(tmp_path, monkeypatch, "--batch-size", "1")  # how it runs, not what it measures: same directory
    assert again.exit_code == 0, again.output
    assert "resuming: 2 points already measured" in again.stderr
    assert "0 points measured, 2 reused from an earlier run" in again.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert run_dir.name.startswith("ppl-tiny-") and len(run_dir.name) == len("ppl-tiny-") + 8
    other = ppl_in(tmp_path, monkeypatch, "--bos")  # another measurement: its own directory
    assert other.exit_code == 0 and "resuming" not in other.stderr
    assert len(list((tmp_path / "runs").iterdir())) == 2


def held_elsewhere(path):
    from ctxeval.runs.lock import RunLock

    lock = RunLock(path)
    lock.acquire()
    return lock


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda t: (t / "README.md").write_text("x") and "README.md", "is a file, not a directory"),
        (lambda t: (t / "README.md").write_text("x") and "README.md/run", "(README.md is a file)"),
        (lambda t: (t / "notes").mkdir() or (t / "notes" / "a.txt").write_text("x") and "notes", "not a ctxeval run"),
        (lambda t: (t / "bad").mkdir() or (t / "bad" / "run.json").write_text("[1") and "bad", "cannot be read"),
    ],
    ids=["file", "through a file", "foreign folder", "unreadable run.json"],
)
@pytest.mark.parametrize(
    "command",
    [
        ["ppl"],
        ["needle"],
        ["passkey"],
        ["ruler"],
        ["entropy"],
        ["tune", "--target-length", "1k"],
        ["lm-eval", "--tasks", "x"],
    ],
)
def test_a_wrong_out_is_refused_before_the_model_loads(no_model, command, make, expected):
    out = make(no_model)
    result = CliRunner().invoke(app, [*command, "--model", "tiny", "--out", out])
    assert result.exit_code == 2, result.output
    assert expected in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_second_process_on_one_directory_is_refused_before_the_model_loads(no_model):
    (no_model / "run").mkdir()
    lock = held_elsewhere(no_model / "run")
    try:
        result = CliRunner().invoke(app, ["ppl", "--model", "tiny", "--out", "run"])
    finally:
        lock.release()
    assert result.exit_code == 2
    assert "is in use by another ctxeval process" in result.stderr


def test_ppl_dry_run_writes_nothing_and_ignores_the_out_check(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "README.md").write_text("x")
    result = CliRunner().invoke(app, ["ppl", "--model", "tiny", "--lengths", "1k", "--dry-run", "--out", "README.md"])
    assert result.exit_code == 0, result.output


def test_a_run_stopped_before_its_first_point_leaves_no_directory(tmp_path, monkeypatch):
    from ctxeval.evals import perplexity

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(perplexity, "sweep", interrupted)
    result = ppl_in(tmp_path, monkeypatch, "--out", "fresh")
    assert result.exit_code == 130
    assert "nothing was measured; removed fresh" in result.stderr
    assert not (tmp_path / "fresh").exists()


def test_a_resumed_run_stopped_again_keeps_its_directory(tmp_path, monkeypatch):
    from ctxeval.evals import perplexity

    assert ppl_in(tmp_path, monkeypatch, "--out", "kept").exit_code == 0

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(perplexity, "sweep", interrupted)
    result = ppl_in(tmp_path, monkeypatch, "--out", "kept", "-m", "yarn:factor=2")  # another spec: --overwrite
    assert result.exit_code == 2 and "different spec" in result.stderr
    result = ppl_in(tmp_path, monkeypatch, "--out", "kept")
    assert (tmp_path / "kept" / "rows.jsonl").read_text().count("\n") == 2
    assert "removed" not in result.stderr


def test_methods_identical_at_these_lengths_are_measured_once(tmp_path, monkeypatch):
    """Issue 39: `-m none -m yarn -m ntk` within the trained length measured yarn and ntk (plain RoPE at factor 1)
    anyway: 2/3 of the run. They are measured once, as none, and their rows are none's."""
    from ctxeval.evals import perplexity

    measured = []
    real_sweep = perplexity.sweep

    def counting(lm, specs, *args, **kwargs):
        measured.extend(spec.label for spec in specs)
        return real_sweep(lm, specs, *args, **kwargs)

    monkeypatch.setattr(perplexity, "sweep", counting)
    result = ppl_in(tmp_path, monkeypatch, "-m", "yarn", "-m", "ntk", "-m", "pi:factor=2", "--out", "run")
    assert result.exit_code == 0, result.output
    assert measured == ["none", "pi(factor=2)"]
    assert "yarn(factor=1), ntk(factor=1) measure exactly as none at these lengths: measured once" in result.stderr
    assert "4 points measured, 0 reused from an earlier run, 0 failed, 4 copied from an identical method" in (
        result.stderr
    )
    rows = [json.loads(line) for line in (tmp_path / "run" / "rows.jsonl").read_text().splitlines()]
    by = {(r["label"], r["length"]): r for r in rows}
    for label in ("yarn(factor=1)", "ntk(factor=1)"):
        for length in (64, 128):
            assert by[(label, length)]["value"] == by[("none", length)]["value"]
            assert by[(label, length)]["same_as"] == "none" and by[(label, length)]["method"] == label[:-10]
    assert by[("pi(factor=2)", 128)]["value"] != by[("none", 128)]["value"]
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["methods"]["ntk(factor=1)"]["same_as"] == "none"
    measured.clear()
    again = ppl_in(tmp_path, monkeypatch, "-m", "yarn", "-m", "ntk", "-m", "pi:factor=2", "--out", "run")
    assert "0 points measured, 8 reused" in again.stderr and measured in ([], ["none", "pi(factor=2)"])


def test_needle_measures_an_identical_method_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["needle", "--model", "tiny", "--lengths", "128", "--depths", "0.5", "--samples", "1", "--out", "n"]
    result = CliRunner().invoke(app, [*args, "-m", "none", "-m", "yarn:factor=1"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "1 point measured" in result.stderr and "1 copied from an identical method" in result.stderr
    rows = [json.loads(line) for line in (tmp_path / "n" / "rows.jsonl").read_text().splitlines()]
    assert [r["label"] for r in rows] == ["none", "yarn(factor=1)"]
    assert rows[0]["response"] == rows[1]["response"] and rows[1]["same_as"] == "none"


@pytest.mark.parametrize(
    "command",
    [["ppl"], ["ruler"], ["entropy"], ["tune", "--target-length", "1k"], ["lm-eval", "--tasks", "x"], ["needle"]],
)
def test_a_wrong_out_is_refused_before_torch_is_imported(tmp_path, command):
    """Issue 39: `--out README.md` was refused after 7-9 s; the check now comes before torch's import."""
    import subprocess
    import sys

    (tmp_path / "README.md").write_text("x")
    code = (
        "import sys\nfrom typer.testing import CliRunner\nfrom ctxeval.cli import app\n"
        f"result = CliRunner().invoke(app, {[*command, '--model', 'tiny', '--out', 'README.md']!r})\n"
        "print(result.exit_code, 'torch' in sys.modules, result.stderr.strip())"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.stdout.startswith("2 False error: --out README.md is a file"), done.stdout + done.stderr


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    """Untrained tiny-nope and tiny-learned checkpoints with tiny's tokenizer (what run_models does with them does not
    depend on their weights)."""
    import torch
    from transformers import AutoTokenizer

    from ctxeval.tiny import MODEL_DIR
    from ctxeval.tiny.family import build_model
    from ctxeval.tiny.train import TinyConfig

    tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)
    folders = {}
    for name in ("tiny-nope", "tiny-learned", "tiny-alibi"):
        torch.manual_seed(0)
        folder = tmp_path_factory.mktemp("family") / name
        build_model(name, TinyConfig(member=name), len(tokenizer), tokenizer).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        folders[name] = str(folder)
    return folders


KNOWN = {"RoPE", "NoPE", "learned", "ALiBi", "sinusoidal"}


def test_ppl_over_several_models_runs_each_and_merges_them_into_one_table(tmp_path, family_dirs):
    out = tmp_path / "family"
    args = ["ppl", "--model", "tiny", "--model", family_dirs["tiny-nope"], "--model", family_dirs["tiny-learned"]]
    args += ["--lengths", "64,128,256", "-m", "none", "-m", "yarn:factor=2", "--docs", "1", "--out", str(out)]
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    said = " ".join(result.stderr.split())
    assert "tiny-nope has no RoPE (model_type 'smollm3' has RoPE off in every layer" in said
    assert "yarn(factor=2) not measured on it" in said
    assert "tiny-learned: its learned positions end at 128: length 256 not measured" in said
    rows = {
        name: [json.loads(line) for line in (out / name / "rows.jsonl").read_text().splitlines()]
        for name in ("tiny", "tiny-nope", "tiny-learned")
    }
    assert {(r["label"], r["length"]) for r in rows["tiny"]} == {
        (label, n) for label in ("none", "yarn(factor=2)") for n in (64, 128, 256)
    }
    assert {(r["label"], r["length"]) for r in rows["tiny-nope"]} == {("none", n) for n in (64, 128, 256)}
    assert {(r["label"], r["length"]) for r in rows["tiny-learned"]} == {("none", 64), ("none", 128)}
    table = (out / "table.md").read_text()
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines() if line.startswith("| ")]
    encodings = {(row[0].rsplit("/", 1)[-1], row[1]): row for row in cells if len(row) > 4 and row[2] in KNOWN}
    assert {key: row[2] for key, row in encodings.items()} == {
        ("tiny", "none"): "RoPE",
        ("tiny", "yarn(factor=2)"): "RoPE",
        ("tiny-nope", "none"): "NoPE",
        ("tiny-learned", "none"): "learned",
    }
    assert encodings[("tiny-learned", "none")][4] == "128"  # valid to 128, where its position table ends
    assert encodings[("tiny-learned", "none")][-1] == "no pos."
    assert result.stdout.startswith("# ctxeval report") and "┏" not in result.stdout  # one merged table, not three
    assert all(line in result.stdout for line in table.splitlines() if line.startswith("| "))

    # the figure compares encodings: an unmodified model's curve takes its encoding's hue, a method keeps its own
    from ctxeval.report import figures, merged
    from ctxeval.report.plots import curve_styles

    group = merged.build_report([out / name for name in ("tiny", "tiny-nope", "tiny-learned")]).groups[0]
    curves = figures.group_curves(group)
    assert [(c.label.rsplit("/", 1)[-1], c.family) for c in curves] == [
        ("tiny (RoPE) · none", "RoPE"),
        ("tiny (RoPE) · yarn(factor=2)", "yarn"),
        ("tiny-nope (NoPE) · none", "NoPE"),
        ("tiny-learned (learned) · none", "learned"),
    ]
    assert len({style["color"] for style in curve_styles(curves)}) == 4


def test_a_learned_position_model_alone_refuses_lengths_past_its_table_before_it_loads(
    tmp_path, family_dirs, monkeypatch
):
    def load(*args, **kwargs):
        raise AssertionError("loaded")

    monkeypatch.setattr(run, "load_for", load)
    args = ["ppl", "--model", family_dirs["tiny-learned"], "--lengths", "128,256", "--out", str(tmp_path / "r")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and not isinstance(result.exception, AssertionError)
    assert "has learned positions for 128 tokens and none past them: it cannot read length 256" in result.stderr
    assert "ask lengths up to 128" in result.stderr
    # ctxeval's layout: prompt + reply budget fill the length, so 128 fits and 256 does not
    args = ["needle", "--model", family_dirs["tiny-learned"], "--lengths", "128,256", "--out", str(tmp_path / "n")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "cannot read length 256; ask lengths up to 128" in result.stderr
    args = ["needle", "--model", family_dirs["tiny-learned"], "--lengths", "128", "--samples", "1"]
    args += ["--depths", "50", "--out", str(tmp_path / "n128")]
    with pytest.raises(AssertionError, match="loaded"):  # past every check from the config: the model loads
        CliRunner().invoke(app, args, catch_exceptions=False)
    # YaRN's passkey: the prompt stays under the length and its 10 new tokens (+ the step) come after it
    args = ["passkey", "--model", family_dirs["tiny-learned"], "--lengths", "128", "--out", str(tmp_path / "p")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "(+11 new tokens); ask lengths up to 117" in result.stderr


def test_a_rope_method_on_a_model_without_rope_alone_is_refused_before_it_loads(tmp_path, family_dirs, monkeypatch):
    def load(*args, **kwargs):
        raise AssertionError("loaded")

    monkeypatch.setattr(run, "load_for", load)
    args = ["ppl", "--model", family_dirs["tiny-nope"], "--lengths", "128", "-m", "yarn:factor=2"]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "r")])
    assert result.exit_code == 2 and not isinstance(result.exception, AssertionError)
    assert "has no RoPE (model_type 'smollm3' has RoPE off in every layer" in result.stderr
    assert "only --method none applies" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_an_unknown_model_among_several_is_refused_before_any_runs(tmp_path, monkeypatch):
    def load(*args, **kwargs):
        raise AssertionError("loaded")

    monkeypatch.setattr(run, "load_for", load)
    args = ["ppl", "--model", "tiny", "--model", str(tmp_path / "nothing-here"), "--lengths", "128"]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "r")])
    assert result.exit_code == 2 and not isinstance(result.exception, AssertionError)
    assert "nothing-here" in result.stderr and not (tmp_path / "r").exists()


def test_a_model_that_refuses_once_loaded_leaves_the_others_measured_and_merged(tmp_path, family_dirs):
    out = tmp_path / "t"
    args = ["ppl", "--model", "tiny", "--model", family_dirs["tiny-alibi"], "--model", family_dirs["tiny-nope"]]
    args += ["--lengths", "64", "--attention-temperature", "1.2", "--docs", "1", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    said = " ".join(result.stderr.split())
    assert result.exit_code == 2 and "--attention-temperature: the attention of" in said  # Falcon's: refused
    assert "1 of 3 models not measured: " in said and said.rstrip().endswith("tiny-alibi")
    assert (out / "tiny" / "rows.jsonl").is_file() and (out / "tiny-nope" / "rows.jsonl").is_file()
    assert not (out / "tiny-alibi").exists() and "tiny-alibi" not in (out / "table.md").read_text()


def test_tiny_family_names_tiny_and_its_family_once_each():
    from ctxeval.models.load import expand_model_names, shipped_family
    from ctxeval.tiny.family import MEMBERS

    family = ["tiny", *shipped_family()]
    assert expand_model_names(["tiny-family"]) == family and set(family) <= set(MEMBERS)
    assert expand_model_names(["tiny-alibi", "tiny-family", "smollm2"]) == [
        "tiny-alibi",
        *[m for m in family if m != "tiny-alibi"],
        "smollm2",
    ]
    assert expand_model_names("tiny") == ["tiny"] and expand_model_names(None) == []
