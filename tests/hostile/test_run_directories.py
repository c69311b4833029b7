"""Run directories written by someone else, through the CLI: a row the report cannot use is skipped and counted,
a directory that is not a ctxeval run is refused in one line, a writer that fails leaves no half file, a resume
keeps every byte already measured (issue 25)."""

import json
import os
import shutil
from pathlib import Path

import pytest
from hostile.refusal import invoke, refused

RESULTS = Path(__file__).resolve().parents[2] / "results"


def copy_run(src, dst):
    dst.mkdir(parents=True)
    for name in ("run.json", "rows.jsonl"):
        shutil.copy(RESULTS / src / name, dst / name)
    return dst


def edit_row(index, **fields):
    def edit(lines):
        row = json.loads(lines[index])
        row.update(fields)
        lines[index] = json.dumps(row).encode()  # NaN and Infinity as Python's json writes them
        return lines

    return edit


def insert(index, raw):
    def edit(lines):
        lines.insert(index, raw)
        return lines

    return edit


SKIPPED = [  # (run, edit of rows.jsonl's lines, why the note gives)
    ("ppl-tiny-pydoc", insert(1, b"[1, 2]"), "not a JSON object (a list)"),
    ("ppl-tiny-pydoc", insert(1, b"[" * 200_000 + b"]" * 200_000), "nested too deep"),
    ("ppl-tiny-pydoc", insert(1, b'{"model": "caf\xe9"}'), "not UTF-8"),
    ("ppl-tiny-pydoc", insert(1, b'{"model": "tiny", "label": "none", "len'), "not JSON"),
    ("ppl-tiny-pydoc", edit_row(0, length=float("nan")), "length nan is not a whole number"),
    ("ppl-tiny-pydoc", edit_row(0, length=float("inf")), "length inf is not a whole number"),
    ("ppl-tiny-pydoc", edit_row(0, length=1e30), "is not a whole number of tokens"),
    ("ppl-tiny-pydoc", edit_row(0, nll_sum=float("inf")), "nll_sum is not a finite number"),
    ("ppl-tiny-pydoc", edit_row(0, nll_sum=1e6), "perplexity would overflow"),
    ("ppl-tiny-pydoc", edit_row(0, n_tokens=0), "perplexity would overflow"),
    ("ppl-tiny-pydoc", edit_row(0, model=["tiny"]), "model is not text"),
    ("ppl-tiny-pydoc", edit_row(0, label={"a": 1}), "label is not text"),
    (
        "ppl-tiny-pydoc",
        edit_row(0, position_edges=[1, 32], position_nll_sum=[float("inf")], position_tokens=[3]),
        "position bucket",
    ),
    ("needle-tiny-pydoc", edit_row(0, correct=5), "correct of an ok row is not a number in [0, 1]"),
    ("needle-tiny-pydoc", edit_row(0, depth=float("nan")), "depth is not a finite number"),
    ("ruler-tiny-pydoc", edit_row(0, score="abc"), "score of an ok row is not a number in [0, 1]"),
    ("ruler-tiny-pydoc", edit_row(0, sample=-1), "sample is not a whole number"),
    ("lm-eval-tiny-examples", edit_row(0, value=float("nan")), "value of an ok row is not a finite number"),
    ("entropy-tiny-pydoc", edit_row(0, layers=5), "layers / entropy_per_layer"),
    ("entropy-tiny-pydoc", edit_row(0, entropy=float("-inf")), "entropy of an ok row"),
]


def _strict(text):
    def refuse(name):
        raise AssertionError(f"{name} in strict JSON output")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("run, edit, why", SKIPPED, ids=[w[:40] for _, _, w in SKIPPED])
def test_a_row_a_report_cannot_use_is_skipped_and_counted(tmp_path, run, edit, why):
    """Every other row is reported; the note counts the skipped line and says why; --format json stays strict JSON
    (no NaN, no Infinity) and the markdown never shows 'inf' as a value."""
    d = copy_run(run, tmp_path / run)
    lines = edit((d / "rows.jsonl").read_bytes().rstrip(b"\n").split(b"\n"))
    (d / "rows.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    result = invoke(["report", d, "--format", "json"])
    assert result.exit_code == 0, result.output
    data = _strict(result.stdout)
    notes = [line for line in result.stderr.splitlines() if f"skipped 1 of {len(lines)} lines" in line]
    assert len(notes) == 1 and why in notes[0], result.stderr
    assert data["runs"][0]["rows"] == len(lines) - 1
    md = invoke(["report", d])
    assert md.exit_code == 0 and "skipped 1 of" in md.stdout
    assert not any(cell.strip() in ("inf", "nan") for line in md.stdout.splitlines() for cell in line.split("|"))


REFUSED_DIRS = [  # (run, what is done to the directory, fragment)
    ("ppl-tiny-pydoc", lambda d: (d / "run.json").write_text("[1]"), "not a JSON object"),
    ("ppl-tiny-pydoc", lambda d: (d / "run.json").write_text("[" * 5000 + "]" * 5000), "nested deeper than 64"),
    (
        "ppl-tiny-pydoc",
        lambda d: (d / "run.json").write_bytes('{"status": "caf\u00e9"}'.encode("latin-1")),
        "not UTF-8 text",
    ),
    ("ppl-tiny-pydoc", lambda d: _record(d, model=["tiny"]), "'model' is not a JSON object"),
    ("ppl-tiny-pydoc", lambda d: _record(d, key_tokens=[1]), "'key_tokens' is not a JSON object"),
    ("ppl-tiny-pydoc", lambda d: _record(d, spec="ppl"), "'spec' is not a JSON object"),
    ("ruler-tiny-pydoc", lambda d: _record(d, protocol={"threshold": "abc"}), "threshold 'abc' is not a number"),
    ("ruler-tiny-pydoc", lambda d: _record(d, protocol={"threshold": float("inf")}), "is not a number in (0, 100]"),
    ("ppl-tiny-pydoc", lambda d: (d / "rows.jsonl").write_bytes(b"[1]\n[2]\n"), "holds no usable rows"),
    (
        "ppl-tiny-pydoc",
        lambda d: (d / "rows.jsonl").write_bytes(
            (RESULTS / "ppl-tiny-pydoc" / "rows.jsonl").read_text().encode("utf-16")
        ),
        "line 1: not UTF-8",
    ),
    ("ppl-tiny-pydoc", lambda d: ((d / "rows.jsonl").unlink(), (d / "rows.jsonl").mkdir()), "is a directory"),
    ("ppl-tiny-pydoc", lambda d: ((d / "run.json").unlink(), os.mkfifo(d / "run.json")), "not a regular file"),
    ("ppl-tiny-pydoc", lambda d: _record(d, spec={"task": ["ppl"]}), "unknown task"),
    ("ppl-tiny-pydoc", lambda d: _record(d, history=5), "'history' is not a JSON list"),
    ("ppl-tiny-pydoc", lambda d: _record(d, spec={"task": "ppl", "methods": 5}), "'spec.methods' is not a JSON list"),
    ("ppl-tiny-pydoc", lambda d: _record(d, protocol={"aggregate": 5}), "protocol aggregate '5' is not one of"),
]


def _record(d, **fields):
    record = json.loads((d / "run.json").read_text())
    record.update(fields)
    (d / "run.json").write_text(json.dumps(record))


@pytest.mark.parametrize("run, damage, fragment", REFUSED_DIRS, ids=[frag[:40] for _, _, frag in REFUSED_DIRS])
@pytest.mark.parametrize("fmt", ["md", "json"])
def test_a_run_directory_that_is_not_a_ctxeval_run_is_refused(tmp_path, run, damage, fragment, fmt):
    d = copy_run(run, tmp_path / "run")
    damage(d)
    refused(invoke(["report", d, "--format", fmt]), fragment)


def test_report_writers_fail_in_one_line_and_leave_no_half_file(tmp_path):
    d = copy_run("ppl-tiny-pydoc", tmp_path / "run")
    refused(invoke(["report", d, "--html", "/dev/full"]), "cannot write --html /dev/full (No space left on device)")
    out = tmp_path / "rep"
    (out / "table.md").mkdir(parents=True)
    refused(invoke(["report", d, "--out", out]), "table.md: it is a directory")
    refused(invoke(["report", d, "--out", "/dev/full/report"]), "cannot create the directory")
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]  # no temporary file left behind
    good = tmp_path / "page.html"
    assert invoke(["report", d, "--html", good]).exit_code == 0
    assert good.read_text().rstrip().endswith("</html>") and not list(tmp_path.glob(".page.html.*"))


@pytest.fixture(scope="module")
def ppl_run(tmp_path_factory):
    """A finished two-length, two-method ppl run of the tiny model (a few seconds)."""
    out = tmp_path_factory.mktemp("resume") / "run"
    result = invoke(PPL_ARGS + ["--out", out])
    assert result.exit_code == 0, result.output
    return out


PPL_ARGS = [
    "ppl",
    "--model",
    "tiny",
    "--device",
    "cpu",
    "--lengths",
    "64,128",
    "--docs",
    "1",
    "-m",
    "none",
    "-m",
    "pi:factor=2",
]


def test_a_resume_keeps_every_measured_byte_and_measures_only_what_it_cannot_use(ppl_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(ppl_run, run)
    lines = (run / "rows.jsonl").read_bytes().rstrip(b"\n").split(b"\n")
    assert len(lines) == 4
    broken = json.loads(lines[3])
    broken["length"] = float("nan")  # pi(factor=2) at 128: its point is no longer measured
    lines[3] = json.dumps(broken).encode()
    lines[1:1] = [b"[1, 2, 3]", b"[" * 100_000 + b"]" * 100_000, b'"text"', b"\xff\xfe"]
    before = b"\n".join(lines) + b"\n"
    (run / "rows.jsonl").write_bytes(before)
    result = invoke(PPL_ARGS + ["--out", run])
    assert result.exit_code == 0, result.output
    assert "note: skipped 5 of 8 lines of" in result.stderr
    after = (run / "rows.jsonl").read_bytes()
    assert after.startswith(before)  # nothing already written is lost or rewritten
    new = [json.loads(line) for line in after[len(before) :].splitlines()]
    assert [(r["label"], r["length"]) for r in new] == [("pi(factor=2)", 128)]  # the one point it cannot use


def test_a_run_json_that_is_not_ctxeval_s_is_refused_unless_overwritten(ppl_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(ppl_run, run)
    (run / "run.json").write_text('["not", "a", "run"]')
    refused(invoke(PPL_ARGS + ["--out", run]), "run.json cannot be read as a ctxeval run")
    assert (run / "rows.jsonl").read_bytes() == (ppl_run / "rows.jsonl").read_bytes()
    (run / "run.json").write_text(
        json.dumps({**json.loads((ppl_run / "run.json").read_text()), "history": "x", "methods": [1]})
    )
    assert invoke(PPL_ARGS + ["--out", run]).exit_code == 0  # same spec, odd history/methods: resumed
