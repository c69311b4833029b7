"""A seeded fuzz of the shared parsers and the rows reader, and of run.json through the report: a correct value
or one CtxevalError line, never another exception, never a hang, within a time budget (issue 25)."""

import json
import math
import random
import shutil
import signal
import time
from pathlib import Path

from hostile.refusal import Hang

from ctxeval.cli.options import MAX_LENGTHS, parse_depths, parse_indices, parse_lengths, parse_numbers
from ctxeval.errors import CtxevalError
from ctxeval.evals.positions import MAX_BUCKETS, parse_position_buckets
from ctxeval.runs.rows import KINDS, row_problem
from ctxeval.runs.store import load_rows
from ctxeval.specs import expand_specs
from ctxeval.util import textfiles
from ctxeval.util.numbers import MAX_TOKENS, parse_number, parse_token_count, parse_whole, whole_number

RESULTS = Path(__file__).resolve().parents[2] / "results"


def _alarm(*_):
    raise Hang("no answer within the time limit")


def copy_run(src, dst):
    dst.mkdir(parents=True)
    for name in ("run.json", "rows.jsonl"):
        shutil.copy(RESULTS / src / name, dst / name)
    return dst


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
            "dca",
            "string",
            "qscale-llama4",
            "qscale-mistral",
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
        "attn_scale",
        "floor_scale",
        "chunk_size",
        "local_size",
        "shift",
        "local",
        "scale",
        "beta",
        "original",
        "layers",
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
