"""Hostile input, round 3 (issue 25): the newer commands (ruler, lm-eval, longrope factor files, attention specs,
--key-tokens, --position-buckets, report and --html, plan --plot) and every file ctxeval reads or writes, through the
CLI as a user runs it. A refused input is one `error:` line on stderr, exit code 2, no traceback and no hang; a run
directory written by someone else either loses the rows it cannot use (a note counts them, the report stays strict
JSON with no infinite value) or is refused in one line; a resume keeps every byte already measured. Then a seeded fuzz
of the shared parsers and the rows reader: a correct value or one CtxevalError line, never another exception, never
a hang, within a time budget."""

import json
import os
from pathlib import Path

import pytest
from hostile.refusal import invoke, refused

GEOM = ["--head-dim", "64", "--base", "10000", "--original-length", "2048"]


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
    (
        ["--tasks", "fwe", "--lengths", "128"],
        "--lengths 128 is shorter than the smallest prompt of fwe (250)",
    ),  # it hung
    (
        ["--tasks", "fwe", "--lengths", "64"],
        "--lengths 64 is shorter than the smallest prompt of fwe (250)",
    ),  # IndexError
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
    (["--tasks", ",,", "--lengths", "1k"], "--tasks names no task"),
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
