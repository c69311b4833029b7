"""Hostile input, round 3 (issue 25): the newer commands (ruler, lm-eval, longrope factor files, attention specs,
--key-tokens, --position-buckets, report and --html, plan --plot) and every file ctxeval reads or writes, through the
CLI as a user runs it. A refused input is one `error:` line on stderr, exit code 2, no traceback and no hang; a run
directory written by someone else either loses the rows it cannot use (a note counts them, the report stays strict
JSON with no infinite value) or is refused in one line; a resume keeps every byte already measured. Then a seeded fuzz
of the shared parsers and the rows reader: a correct value or one CtxevalError line, never another exception, never
a hang, within a time budget."""

import json
import math
import os
import random
import shutil
import signal
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ctxeval.cli import app
from ctxeval.cli.options import MAX_LENGTHS, parse_depths, parse_indices, parse_lengths, parse_numbers
from ctxeval.errors import CtxevalError
from ctxeval.evals.positions import MAX_BUCKETS, parse_position_buckets
from ctxeval.runs.rows import KINDS, row_problem
from ctxeval.runs.store import load_rows
from ctxeval.specs import expand_specs
from ctxeval.util import textfiles
from ctxeval.util.numbers import MAX_TOKENS, parse_number, parse_token_count, parse_whole, whole_number

RESULTS = Path(__file__).resolve().parent.parent / "results"
runner = CliRunner()
GEOM = ["--head-dim", "64", "--base", "10000", "--original-length", "2048"]


class Hang(Exception):
    pass


def _alarm(*_):
    raise Hang("no answer within the time limit")


def invoke(args, limit=120):
    """The CLI in-process, with a wall-clock limit: a hang fails the test instead of stalling the suite."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(limit)
    try:
        return runner.invoke(app, [str(a) for a in args])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def refused(result, fragment):
    """Exit 2, exactly one `error:` line holding `fragment`, no traceback."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and not isinstance(result.exception, Hang)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert fragment in errors[0], errors[0]
    return errors[0]


# -- the hostile files ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def f(tmp_path_factory):
    """Files no one should hand ctxeval, by name."""
    d = tmp_path_factory.mktemp("hostile")
    files = {
        "empty.txt": b"",
        "blank.txt": b"  \n\n\t\n",
        "latin1.txt": "café au lait, an essay\n".encode("latin-1"),
        "utf16.txt": "an essay in UTF-16\n".encode("utf-16"),
        "latin1.json": '{"short_factor": [1.0], "text": "café"}'.encode("latin-1"),
        "deep.json": b"[" * 200_000 + b"]" * 200_000,
        "inf.json": b'{"short_factor": [Infinity]}',
        "huge.json": b'{"short_factor": [1e999]}',
        "bigint.json": b'{"short_factor": [' + b"9" * 5000 + b"]}",
        "strings.json": b'{"short_factor": ["a", "b"]}',
        "nofactor.json": b'{"rope_scaling": {"type": "longrope"}}',
        "nan.toml": b"short_factor = [nan]\n",
        "list.json": b"[1, 2]",
        "numbers.json": b"[1, 2, 3]",
        "emptyessay.json": b'{"text": "  "}',
        "numtext.json": b'{"text": 5}',
        "binary.bin": b"\x00\x01\x02\x03" * 100,
    }
    for name, data in files.items():
        (d / name).write_bytes(data)
    os.mkfifo(d / "fifo")
    (d / "adir").mkdir()
    llama = {
        "model_type": "llama",
        "rope_theta": 10000,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "max_position_embeddings": 128,
    }
    configs = {
        "m-deep": b"[" * 100_000 + b"]" * 100_000,
        "m-latin1": '{"name": "caf\u00e9"}'.encode("latin-1"),
        "m-list": b"[1]",
        "m-theta": json.dumps({**llama, "rope_theta": "abc"}).encode(),
        "m-inf": json.dumps({**llama, "rope_theta": float("inf")}).encode(),
        "m-length": json.dumps({**llama, "max_position_embeddings": -5}).encode(),
        "m-heads": json.dumps({**llama, "num_attention_heads": 0}).encode(),
    }
    for name, config in configs.items():
        (d / name).mkdir()
        (d / name / "config.json").write_bytes(config)
    return lambda name: str(d / name)


def samples_dir(root, length, task, content):
    """A --samples-from folder whose one validation.jsonl holds `content` (bytes)."""
    path = Path(root) / str(length) / task / "validation.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return str(root)


# -- ruler -------------------------------------------------------------------------------------------------------

GOOD_SAMPLE = b'{"input": "The code is 42. What is the code?", "outputs": ["42"], "answer_prefix": " The code is"}\n'

RULER = [  # (extra args, the fragment of the one error line); {name} is a hostile file
    (["--tasks", "fwe", "--lengths", "128"], "shorter than the task's smallest prompt"),  # it hung
    (["--tasks", "fwe", "--lengths", "64"], "shorter than the task's smallest prompt"),  # IndexError
    (["--tasks", "niah_single_2", "--lengths", "2k", "--essays", "{empty.txt}"], "holds no text"),  # measured 93 tokens
    (["--tasks", "niah_single_2", "--lengths", "2k", "--essays", "{blank.txt}"], "holds no text"),
    (["--tasks", "niah_single_2", "--lengths", "2k", "--essays", "{emptyessay.json}"], "holds no text"),
    (["--tasks", "niah_single_2", "--lengths", "2k", "--essay-substitute", "{empty.txt}"], "holds no text"),
    (["--tasks", "niah_single_2", "--lengths", "2k", "--essays", "{latin1.txt}"], "is not UTF-8 text: byte 0xe9"),
    (["--tasks", "niah_single_2", "--lengths", "2k", "--essays", "{utf16.txt}"], "UTF-16 byte-order mark"),
    (["--tasks", "niah_single_2", "--lengths", "2k", "--essays", "{binary.bin}"], "binary content"),
    (["--tasks", "niah_single_2", "--lengths", "2k", "--essays", "{deep.json}"], "nested deeper than 64 levels"),
    (["--tasks", "niah_single_2", "--lengths", "2k", "--essays", "{numtext.json}"], "not RULER's PaulGrahamEssays"),
    (["--tasks", "niah_single_2", "--lengths", "2k", "--essays", "{latin1.json}"], "is not UTF-8 text"),
    (["--tasks", "cwe", "--lengths", "1k", "--cwe-words", "{latin1.txt}"], "cannot read it (not UTF-8 text"),
    (["--tasks", "cwe", "--lengths", "1k", "--cwe-words", "{fifo}"], "cannot read it (not a regular file)"),
    (["--tasks", "cwe", "--lengths", "1k", "--cwe-words", "{adir}"], "cannot read it (a directory)"),
    (["--tasks", "cwe", "--lengths", "1k", "--cwe-words", "{deep.json}"], "nested deeper than 64 levels"),
    (["--tasks", "cwe", "--lengths", "1k", "--cwe-words", "{numbers.json}"], "holds no words"),
    (["--tasks", "vt", "--lengths", "inf"], "bad length 'inf' (not a finite number)"),
    (["--tasks", "vt", "--lengths", "nan"], "bad length 'nan' (not a finite number)"),
    (["--tasks", "vt", "--lengths", "1e300"], "bad length '1e300' (more than a model can read)"),
    (["--tasks", "vt", "--lengths", "1k:4k:xabc"], "geometric step must be xFACTOR with a finite number > 1"),
    (["--tasks", "vt", "--lengths", "1k:4k:xinf"], "geometric step must be xFACTOR with a finite number > 1"),
    (["--tasks", "vt", "--lengths", "1k:16k:x1.0000001"], "more than 10,000; use a larger step"),
    (["--tasks", "vt", "--lengths", "2:100000000:1"], "more than 10,000; use a larger step"),
    (["--tasks", "vt", "--threshold", "nan"], "--threshold must be a finite number in (0, 100], got nan"),
    (["--tasks", ",,", "--lengths", "1k"], "--tasks names no RULER task"),
    (["--tasks", "vt", "--factor", "inf"], "--factor takes finite numbers"),
    (["--tasks", "vt", "-m", "yarn:factor=nan"], "yarn: factor must be finite"),
]
SAMPLES_FROM = [  # (validation.jsonl content, fragment)
    ("latin".encode("utf-8") + b'{"input": "caf\xe9"}\n', "line 1 is not a RULER sample (not UTF-8)"),
    (b"[1, 2]\n", "line 1 is not a RULER sample (not a JSON object"),
    (GOOD_SAMPLE + b"[" * 100_000 + b"]" * 100_000 + b"\n", "line 2 is not a RULER sample (nested too deep)"),
    (b'{"input": "x", "outputs": "42"}\n', "outputs is not a non-empty list of answers"),
    (b'{"input": "x", "outputs": ["42"], "length": Infinity}\n', "length is not a whole number of tokens"),
    (b'{"input": ["x"], "outputs": ["42"]}\n', "input is not text"),
    (b'{"input": "x", "outputs": ["42"], "token_position_answer": NaN}\n', "token_position_answer is not a whole"),
]


@pytest.mark.parametrize("args, fragment", RULER, ids=[" ".join(a)[:60] for a, _ in RULER])
def test_ruler_refuses_in_one_line(tmp_path, f, args, fragment):
    args = [f(a[1:-1]) if a.startswith("{") and a.endswith("}") and len(a) > 2 else a for a in args]
    result = invoke(["ruler", "--model", "tiny", "--device", "cpu", "--samples", "1", "--out", tmp_path / "r", *args])
    refused(result, fragment)
    assert not (tmp_path / "r" / "rows.jsonl").exists()  # nothing measured short


@pytest.mark.parametrize("content, fragment", SAMPLES_FROM, ids=[frag[:40] for _, frag in SAMPLES_FROM])
def test_ruler_samples_from_files_that_are_not_right(tmp_path, content, fragment):
    source = samples_dir(tmp_path / "src", 1024, "vt", content)
    result = invoke(
        [
            "ruler",
            "--model",
            "tiny",
            "--device",
            "cpu",
            "--tasks",
            "vt",
            "--lengths",
            "1k",
            "--samples",
            "1",
            "--samples-from",
            source,
            "--out",
            tmp_path / "r",
        ]
    )
    refused(result, fragment)


def test_fwe_at_the_shortest_length_it_accepts_fills_it(tmp_path):
    """fwe's smallest length (250 tokens here) is measured, and its prompt reaches the length, not 93 tokens."""
    from ctxeval.evals.ruler.generate import generate
    from ctxeval.evals.ruler.sources import Sources
    from ctxeval.models.load import load_model

    tok = load_model("tiny", device="cpu").tokenizer
    sample = generate("fwe", 320, 2, tok, Sources())
    assert all(250 < s.length <= 320 for s in sample)
    assert all(answer in s.input for s in sample for answer in s.outputs)
    with pytest.raises(CtxevalError, match="shorter than the task's smallest prompt"):
        generate("fwe", 249, 1, tok, Sources())


def test_an_essay_that_cannot_grow_the_prompt_is_refused_not_measured_short():
    from ctxeval.evals.ruler.generate import generate
    from ctxeval.evals.ruler.sources import Sources
    from ctxeval.models.load import load_model

    tok = load_model("tiny", device="cpu").tokenizer
    with pytest.raises(CtxevalError, match=r"the essay haystack \(blank\) cannot fill 2048 tokens"):
        generate(
            "niah_single_2",
            2048,
            1,
            tok,
            Sources(essay_words=["", ""], essay_source="blank", _wonderwords={"keys": ["able-cat", "big-dog"]}),
        )


# -- longrope factor files and attention specs (checked by `plan`, the same parser every command uses) ------------

FACTOR_FILES = [
    ("latin1.json", "is not UTF-8 text: byte 0xe9"),
    ("utf16.txt", "UTF-16 byte-order mark"),
    ("deep.json", "nested deeper than 64 levels"),
    ("inf.json", "holds the number Infinity, which is not finite"),
    ("huge.json", "holds the number 1e999, which is not finite"),
    ("bigint.json", "is not JSON ctxeval can read"),
    ("nan.toml", "short_factor[0] is not a finite number"),
    ("fifo", "is not a regular file"),
    ("adir", "is a directory"),
    ("strings.json", "must be a list of numbers"),
    ("nofactor.json", "holds no 'short_factor'"),
    ("missing.json", "cannot read"),
]


@pytest.mark.parametrize("name, fragment", FACTOR_FILES, ids=[n for n, _ in FACTOR_FILES])
def test_longrope_factor_files_that_are_not_right(f, name, fragment):
    spec = f"longrope:short_factor=@{f(name)},long_factor=@{f(name)}"
    line = refused(invoke(["plan", "--method", spec, *GEOM]), fragment)
    assert line.startswith("error: longrope: short_factor")


ATTENTION = [
    ("self-extend:group_size=inf", "self-extend: group_size must be finite, got 'inf'"),  # OverflowError
    ("self-extend:group_size=4,neighbor_window=nan", "neighbor_window must be finite"),
    ("rerope:window=1e300", "rerope: window must be at most 9,007,199,254,740,992"),
    ("rerope:window=-inf", "rerope: window must be finite"),
    ("leaky-rerope:k=1e999", "leaky-rerope: k must be finite"),
    ("ntk:factor=2+logn:length=inf", "logn: length must be finite"),
    ("ntk:factor=2++logn", "ntk: factor must be a number, got '2+'"),
    ("yarn:beta_fast=1e308", "cannot be computed"),  # math domain error
    ("yarn:factor=2+rerope:window=64+self-extend", "combine at most one"),
]


@pytest.mark.parametrize("spec, fragment", ATTENTION, ids=[s for s, _ in ATTENTION])
def test_method_and_attention_specs_that_are_not_right(spec, fragment):
    refused(invoke(["plan", "--method", spec, *GEOM]), fragment)


# -- ppl: --position-buckets and --key-tokens, checked before the model loads -------------------------------------

PPL = [
    (["--position-buckets", "1,inf"], "--position-buckets: 'inf' is not a finite token count"),
    (["--position-buckets", "1,nan"], "--position-buckets: 'nan' is not a finite token count"),
    (["--position-buckets", "1,-inf"], "--position-buckets: '-inf' is not a finite token count"),
    (["--position-buckets", "99999999999"], "--position-buckets must be a bucket count in 1..1024"),
    (["--position-buckets", "1e999"], "--position-buckets takes a bucket count"),
    (["--position-buckets", ",".join(map(str, range(1, 3000)))], "at most 1025 edges"),
    (["--key-tokens", "tiny", "--key-tokens-method", "yarn:factor=inf"], "yarn: factor must be finite"),
    (["--key-tokens", "tiny", "--key-tokens-method", "rerope:window=nan"], "rerope: window must be finite"),
    (["--attention-temperature", "inf"], "--attention-temperature takes finite numbers"),
    (["--valid-tolerance", "inf"], "--valid-tolerance must be a finite number >= 0, got inf"),
    (["--task", "{latin1.txt}"], "task file"),
    (["--task", "{nan.toml}"], "short_factor[0] is not a finite number"),
    (["--task", "{fifo}"], "is not a regular file"),
    (["--data", "{latin1.txt}"], "is not UTF-8 text"),
]


@pytest.mark.parametrize("args, fragment", PPL, ids=[" ".join(a)[:50] for a, _ in PPL])
def test_ppl_refuses_in_one_line(tmp_path, f, args, fragment):
    args = [f(a[1:-1]) if a.startswith("{") else a for a in args]
    refused(
        invoke(["ppl", "--model", "tiny", "--device", "cpu", "--lengths", "64,128", "--out", tmp_path / "r", *args]),
        fragment,
    )


# -- lm-eval -------------------------------------------------------------------------------------------------------

LM_EVAL = [
    (["--metadata", '{"max_seq_lengths": [NaN]}'], "holds the number NaN, which is not finite"),
    (["--metadata", '{"max_seq_lengths": [1e999]}'], "holds the number 1e999, which is not finite"),
    (["--metadata", "[" * 5000 + "]" * 5000], "nested deeper than 64 levels"),
    (["--limit", "inf"], "--limit must be a finite number > 0, got inf"),
    (["--limit", "nan"], "--limit must be a finite number > 0, got nan"),
    (["--factor", "1e999"], "--factor takes finite numbers"),
    (["-m", "self-extend:group_size=inf"], "group_size must be finite"),
]


@pytest.mark.parametrize("args, fragment", LM_EVAL, ids=[" ".join(a)[:40] for a, _ in LM_EVAL])
def test_lm_eval_refuses_in_one_line(tmp_path, args, fragment):
    pytest.importorskip("lm_eval")
    refused(
        invoke(
            ["lm-eval", "--tasks", "anything", "--model", "tiny", "--device", "cpu", "--out", tmp_path / "r", *args]
        ),
        fragment,
    )


# -- other commands' shared parsers and writers ---------------------------------------------------------------------

OTHERS = [
    (["bound", "--head-dim", "128", "--lengths", "inf"], "not a finite number"),
    (["entropy", "--model", "tiny", "--layers", "inf"], "--layers takes 'all' or indices"),
    (["needle", "--model", "tiny", "--lengths", "128", "--depths", "0:100:1e12"], "bad --depths '0:100:1e12'"),
    (["needle", "--model", "tiny", "--lengths", "128", "--depths", "nan"], "depths are percentages in 0..100"),
    (["plan", "--method", "yarn", "--factor", "4", *GEOM, "--plot", "/dev/full"], "No space left on device"),
    (["plan", "--method", "yarn", "--factor", "4", *GEOM, "--plot", "{adir}/x.xyz"], "not an image format"),
    (["ppl", "--model", "tiny", "--lengths", "64", "--out", "/dev/full/run"], "cannot create the run directory"),
    (
        ["ruler", "--model", "tiny", "--tasks", "vt", "--lengths", "1k", "--out", "/dev/full/run"],
        "cannot create the run directory",
    ),
    # model directories whose config.json another tool (or a hand) wrote
    (["plan", "--method", "yarn", "--model", "{m-deep}"], "config.json is nested deeper than 64 levels"),
    (["plan", "--method", "yarn", "--model", "{m-latin1}"], "config.json is not UTF-8 text"),
    (["plan", "--method", "yarn", "--model", "{m-list}"], "config.json is not a JSON object"),
    (["plan", "--method", "yarn", "--model", "{m-theta}"], "rope_theta = 'abc', not a finite number"),
    (["bound", "--model", "{m-inf}"], "rope_theta = inf, not a finite number"),
    (["plan", "--method", "yarn", "--model", "{m-length}"], "(max_position_embeddings) = -5, not a whole number"),
    (["ppl", "--model", "{m-heads}", "--lengths", "64"], "could not load model"),
    (["ppl", "--model", "{m-deep}", "--lengths", "64"], "config.json is nested deeper than 64 levels"),
]


@pytest.mark.parametrize("args, fragment", OTHERS, ids=[" ".join(a)[:50] for a, _ in OTHERS])
def test_other_commands_refuse_in_one_line(tmp_path, f, args, fragment, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = [f(a[1 : a.index("}")]) + a[a.index("}") + 1 :] if a.startswith("{") else a for a in args]
    refused(invoke(args), fragment)
    assert not (tmp_path / "runs").exists()


# -- run directories written by someone else: `report` -------------------------------------------------------------


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


def test_rows_that_cannot_be_appended_are_one_line_and_keep_what_is_there(tmp_path):
    from ctxeval.runs.store import RunStore

    with RunStore(tmp_path / "run", {"task": "ppl"}) as store:
        store.append([{"model": "m", "label": "none", "length": 64, "doc": "a", "status": "oom"}])
        kept = store.rows_path.read_bytes()
        store.append_path = tmp_path / "run"  # a directory: the kernel refuses the append, as a full disk would
        with pytest.raises(CtxevalError, match="cannot append to .* the points measured so far are kept"):
            store.append([{"model": "m", "label": "none", "length": 128, "doc": "a", "status": "oom"}])
        assert store.rows_path.read_bytes() == kept


# -- run directories written by someone else: resume ---------------------------------------------------------------


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


def test_a_key_tokens_file_that_is_not_right_is_found_again(tmp_path):
    out = tmp_path / "kt"
    args = [
        "ppl",
        "--model",
        "tiny",
        "--device",
        "cpu",
        "--lengths",
        "64,128",
        "--docs",
        "1",
        "--key-tokens",
        "tiny",
        "--out",
        out,
    ]
    assert invoke(args).exit_code == 0
    good = json.loads((out / "key-tokens.json").read_text())
    doc = next(iter(good["documents"]))
    for bad in (
        "[1]",
        '{"settings": 5}',
        json.dumps({**good, "documents": {doc: {"sequence_tokens": 128, "positions": [0, -5]}}}),
    ):
        (out / "key-tokens.json").write_text(bad)
        result = invoke(args)
        assert result.exit_code == 0, result.output
        assert json.loads((out / "key-tokens.json").read_text()) == good  # found again, the same tokens


# -- fuzz: the shared parsers and the rows reader ---------------------------------------------------------------------

PIECES = [
    "1",
    "2",
    "16",
    "128",
    "4k",
    "1.5k",
    "0",
    "-1",
    "inf",
    "-inf",
    "nan",
    "1e999",
    "1e3",
    "x2",
    "x1.0001",
    "xabc",
    ":",
    ",",
    ".",
    "k",
    "K",
    " ",
    "e",
    "9" * 30,
    "\u00e9",
    "\x00",
    "2.5",
    "+",
    "=",
    "yarn",
    "ntk",
    "logn",
    "rerope",
    "self-extend",
    "factor",
    "window",
    "group_size",
    "@",
    ";",
    "\n",
]


def _number(rng):
    return rng.choice(
        ["1", "2", "16", "64", "128", "300", "2048", "0", "1.5", "0.5", "1e3", "-4", "inf", "nan", "1e999", "9" * 30]
    ) + rng.choice(["", "", "k", "K", "x"])


def _text(rng, pieces=PIECES, most=8):
    """Half the time shaped like an option value (numbers, lists, ranges), half the time any mix of pieces."""
    if rng.random() < 0.5:
        shape = rng.randrange(3)
        if shape == 0:
            return _number(rng)
        if shape == 1:
            return ",".join(_number(rng) for _ in range(rng.randint(1, 4)))
        return f"{_number(rng)}:{_number(rng)}:{rng.choice(['', 'x'])}{_number(rng)}"
    return "".join(rng.choice(pieces) for _ in range(rng.randint(0, most)))


def _spec(rng):
    name = rng.choice(
        [
            "yarn",
            "ntk",
            "pi",
            "dynamic-ntk",
            "llama3",
            "none",
            "longrope",
            "rerope",
            "self-extend",
            "logn",
            "leaky-rerope",
            "warp",
            "",
        ]
    )
    keys = [
        "factor",
        "beta_fast",
        "beta_slow",
        "alpha",
        "window",
        "group_size",
        "neighbor_window",
        "k",
        "length",
        "logn",
        "rule",
        "short_factor",
        "x",
        "",
    ]
    params = ",".join(f"{rng.choice(keys)}={_text(rng, PIECES, 3)}" for _ in range(rng.randint(0, 3)))
    spec = name + (":" + params if params else "")
    return spec + (("+" + _spec(rng)) if rng.random() < 0.2 else "")


def _json_text(rng):
    atoms = [
        "1",
        "-0",
        "1e999",
        "NaN",
        "Infinity",
        "-Infinity",
        '"s"',
        "true",
        "null",
        "9" * 5000,
        "[",
        "]",
        "{",
        "}",
        ",",
        ":",
        '"k"',
        "\ufeff",
        "1.5",
        " ",
    ]
    if rng.random() < 0.1:
        depth = rng.choice([10, 63, 64, 65, 1000, 100_000])
        return "[" * depth + "]" * depth
    return "".join(rng.choice(atoms) for _ in range(rng.randint(0, 12)))


GOOD_ROWS = {
    "ppl": {
        "nll_sum": 262.8,
        "n_tokens": 63,
        "window_nll_sum": 4.17,
        "n_windows": 1,
        "doc": "a",
        "position_edges": [1, 32, 64],
        "position_nll_sum": [120.0, 140.0],
        "position_tokens": [31, 32],
        "key_nll_sum": 3.0,
        "key_tokens": 2,
    },
    "needle": {"depth": 50.0, "sample": 0, "correct": 1},
    "passkey": {"sample": 1, "correct": 0},
    "entropy": {"doc": "a", "entropy": 2.3, "uniform_entropy": 3.2, "layers": [0, 1], "entropy_per_layer": [2.0, 2.6]},
    "ruler": {"ruler_task": "vt", "sample": 0, "score": 0.5},
    "lm-eval": {"lm_eval_task": "t", "subtask": "t", "metric": "acc", "filter": "none", "value": 0.5, "stderr": 0.1},
    "tune": {
        "phase": "search",
        "trial": 3,
        "doc": "tuning",
        "value": 98.2,
        "ppl_short": 79.2,
        "short_rise": 0.01,
        "feasible": True,
        "params": {"beta_fast": 2.0},
    },
}
HOSTILE = [
    0,
    -1,
    0.5,
    1e30,
    float("nan"),
    float("inf"),
    float("-inf"),
    "abc",
    None,
    True,
    [],
    {},
    [1, 2],
    2**70,
    "64",
    1e6,
]


def _row(rng, kind):
    """A row of `kind` as ctxeval writes it, then 0 to 2 of its fields replaced by hostile values or removed."""
    row = {
        "model": "tiny",
        "method": "none",
        "label": rng.choice(["none", "yarn(factor=2)"]),
        "params": {},
        "task": kind,
        "status": rng.choice(["ok", "ok", "ok", "oom"]),
        "length": rng.choice([64, 128]),
        **GOOD_ROWS[kind],
    }
    for _ in range(rng.choice([0, 0, 1, 1, 2])):
        name = rng.choice(list(row))
        if rng.random() < 0.15:
            del row[name]
        else:
            row[name] = rng.choice(HOSTILE)
    return row


PARSER_EXAMPLES, ROWS_FILES = 6000, 1000


def _check_parser(fn, text):
    try:
        fn(text)
    except CtxevalError as exc:
        assert "\n" not in str(exc) and str(exc), repr(text)


def test_fuzz_the_shared_parsers_and_the_rows_reader(tmp_path):
    """PARSER_EXAMPLES seeded inputs per parser and ROWS_FILES rows files: each returns a correct value or raises one
    CtxevalError line; anything else, or a call slower than 2 s (a hang), fails. The whole test must finish within
    30 s (about 6 s on 2 shared CPU cores)."""
    rng = random.Random(25)
    start = time.perf_counter()
    old = signal.signal(signal.SIGALRM, _alarm)
    try:
        for _ in range(PARSER_EXAMPLES):
            text = _text(rng)
            signal.alarm(2)
            try:
                value = parse_token_count(text, "--x")
                assert isinstance(value, int) and 0 <= value <= MAX_TOKENS
                token = text.strip().lower()
                expected = float(token[:-1]) * 1024 if token.endswith("k") else float(token)
                assert value == expected, repr(text)
            except CtxevalError as exc:
                assert "\n" not in str(exc)
            try:
                lengths = parse_lengths(text)
                assert lengths == sorted(set(lengths)) and len(lengths) <= MAX_LENGTHS
                assert all(isinstance(n, int) and 2 <= n <= MAX_TOKENS for n in lengths), repr(text)
            except CtxevalError as exc:
                assert "\n" not in str(exc)
            try:
                number = parse_number(text, "--x")
                assert math.isfinite(number) and number == float(text.strip())
            except CtxevalError as exc:
                assert "\n" not in str(exc)
            try:
                whole = parse_whole(text, "--x", minimum=0)
                assert whole == float(text.strip()) and whole >= 0
            except CtxevalError as exc:
                assert "\n" not in str(exc)
            try:
                edges = parse_position_buckets(text, 4096, 128)
                assert list(edges) == sorted(set(edges)) and len(edges) <= MAX_BUCKETS + 1
            except CtxevalError as exc:
                assert "\n" not in str(exc)
            for fn in (
                lambda t: parse_depths(t, "linear"),
                lambda t: parse_numbers(t, "--factor", "2"),
                lambda t: parse_indices(t, "--layers"),
            ):
                _check_parser(fn, text)
            try:
                specs = expand_specs([_spec(rng)], None)
                assert specs and all(isinstance(s.label, str) for s in specs)
            except CtxevalError as exc:
                assert "\n" not in str(exc)
            json_text = _json_text(rng)
            try:
                parsed = textfiles.parse_json(json_text, "fuzz.json")
                assert textfiles.depth_of(parsed, 64) <= 64
                assert json.dumps(parsed, allow_nan=False) is not None  # finite: strict JSON holds it
            except CtxevalError as exc:
                assert "\n" not in str(exc)
            signal.alarm(0)
        for i in range(ROWS_FILES):
            kind = rng.choice(KINDS)
            raw = [json.dumps(_row(rng, kind)).encode() for _ in range(rng.randint(0, 6))]
            raw += [_json_text(rng).encode(), bytes(rng.randrange(256) for _ in range(rng.randint(0, 8)))][
                : rng.randint(0, 2)
            ]
            rng.shuffle(raw)
            path = tmp_path / f"rows{i}.jsonl"
            path.write_bytes(b"\n".join(raw))
            signal.alarm(2)
            found = load_rows(path, kind)
            signal.alarm(0)
            assert len(found.rows) + len(found.skipped) == len([r for r in b"\n".join(raw).split(b"\n") if r.strip()])
            for row in found.rows:  # every row kept is one a table can compute from
                assert row_problem(row, kind) is None
                assert whole_number(row["length"], minimum=1) is not None
                if row["status"] == "ok" and kind == "ppl":
                    assert math.isfinite(math.exp(row["nll_sum"] / row["n_tokens"]))
            if found.rows and kind in ("ppl", "needle", "ruler"):  # the long tables reports build from rows
                from ctxeval.report import tables

                signal.alarm(5)
                {
                    "ppl": lambda rows: (tables.ppl_long(rows), tables.positions_long(rows), tables.longppl_long(rows)),
                    "needle": tables.needle_long,
                    "ruler": tables.ruler_task_scores,
                }[kind](found.rows)
                signal.alarm(0)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert time.perf_counter() - start < 30


def _mutate(rng, value, depth=0):
    """`value` (a run.json) with one field somewhere in it replaced by a hostile value or removed."""
    if isinstance(value, dict) and value and (depth == 0 or rng.random() < 0.7):
        key = rng.choice(list(value))
        out = dict(value)
        if rng.random() < 0.1:
            del out[key]
        else:
            out[key] = _mutate(rng, value[key], depth + 1)
        return out
    if isinstance(value, list) and value and rng.random() < 0.5:
        i = rng.randrange(len(value))
        return value[:i] + [_mutate(rng, value[i], depth + 1)] + value[i + 1 :]
    return rng.choice(HOSTILE + ["x" * 300, [[[[1]]]], {"a": {"b": [None]}}])


def test_fuzz_run_json_through_the_report(tmp_path):
    """150 seeded run.json files, each a ctxeval run.json with one field replaced anywhere in it: the report (its
    JSON, strict, and its HTML page) is built, or the directory is refused in one line; nothing else, within 30 s."""
    from ctxeval.report.html import to_html
    from ctxeval.report.merged import build_report
    from ctxeval.report.render import to_json

    rng = random.Random(2025)
    start = time.perf_counter()
    built = refused_dirs = 0
    for i in range(150):
        src = rng.choice(["ppl-tiny-pydoc-1doc", "lm-eval-tiny-examples", "ruler-tiny-pydoc"])
        d = copy_run(src, tmp_path / f"run{i}")
        record = _mutate(rng, json.loads((d / "run.json").read_text()))
        (d / "run.json").write_text(json.dumps(record))
        old = signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(10)
        try:
            rep = build_report([d])
            json.dumps(to_json(rep), allow_nan=False)
            assert to_html(rep, {}, {}).rstrip().endswith("</html>")
            built += 1
        except CtxevalError as exc:
            assert str(exc) and "\n" not in str(exc)
            refused_dirs += 1
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)
    assert built > 50 and refused_dirs > 5  # both paths are exercised
    assert time.perf_counter() - start < 30
