"""The retrieval tasks' prompts from the originals' own released files (`ctxeval ruler --samples-from DIR`):

- litm:kv reads the one `kv-retrieval-*_keys.jsonl.gz` (or `.jsonl`) in DIR (lost-in-the-middle's
  kv_retrieval_data/): the first `limit` examples, each with its gold pair moved to every asked depth
  (litm_kv.kv_sample), numbered as suite.generate_suite numbers them (depth's position x examples + j).
- helmet:json_kv reads DIR/test_k{N}_dep6.jsonl, N from HELMET's Llama-2 table for the length: the first `limit`
  rows, not HELMET's `data.shuffle(seed=42).select(range(100))` (that permutation is HF datasets'); the depth is
  the row's own `depth` (a fraction, shown in percent).
- infbench:* read DIR/{kv_retrieval,passkey,number_string,math_find}.jsonl (InfiniteBench's HF files): the first
  `limit` rows, prompted with yarn-mistral's templates. The released prompts run to ~128k tokens; InfiniteBench
  cuts the middle of a longer prompt, ctxeval cuts nothing: the prompt is measured whole, `size` holds its true
  count (pairs, noise lines, list items) and `length` is -1 (ruler.run.check_fits refuses one past the length).

Each sample's input is the whole prompt (no answer prefix), its outputs the answers the task's scorer accepts.
litm:kv's prompt is put in `wrapper` (suite.task_wrapper: the run's chat template for an instruct model, as LITM
formats one); HELMET's and InfiniteBench's are bare, as their originals send them to every model.
"""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from ...errors import CtxevalError
from ...util.textfiles import parse_line
from ..prompts.sample import RulerSample
from ..prompts.wrapping import wrap
from . import helmet_json_kv, infinitebench, litm_kv
from .suite import INFBENCH_TEMPLATE, check_depths

LITM_PATTERNS = ("kv-retrieval-*_keys.jsonl.gz", "kv-retrieval-*_keys.jsonl")
INFBENCH_FILES = {
    "infbench:kv_retrieval": "kv_retrieval.jsonl",
    "infbench:passkey": "passkey.jsonl",
    "infbench:number_string": "number_string.jsonl",
    "infbench:math_find": "math_find.jsonl",
}
ORIGINAL_TASKS = ("litm:kv", "helmet:json_kv", *INFBENCH_FILES)  # the suite tasks whose originals released files


T = TypeVar("T")


@dataclass(frozen=True)
class Row:
    """What infinitebench_prompt reads of a released row."""

    context: str
    input: str


class BadLine(ValueError):
    """What a line lacks; the reader adds the file and line."""


def rows(path: Path, limit: int, expected: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """The first `limit` JSON objects of a JSON Lines file (gzip by its suffix), with their line numbers; read
    line by line, so a 128k-token file is not read whole for a few rows."""
    if not path.is_file():
        raise CtxevalError(f"{path} is missing: --samples-from needs the original's file there ({expected})")
    opener = gzip.open if path.suffix == ".gz" else open
    found = 0
    try:
        with opener(path, "rb") as fh:
            for number, raw in enumerate(fh, 1):
                if found >= limit:
                    return
                if not raw.strip():
                    continue
                value, why = parse_line(raw.rstrip(b"\r\n"))
                if why is not None:
                    raise CtxevalError(f"{path} line {number} is {why}; expected a JSON object with {expected}")
                found += 1
                yield number, value
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise CtxevalError(f"cannot read {path} ({exc}); expected JSON Lines with {expected}") from None


def text_field(row: dict[str, Any], name: str) -> str:
    value = row.get(name)
    if not isinstance(value, str):
        raise BadLine(f"`{name}` is not a string")
    return value


def pair(value: Any, name: str) -> tuple[str, str]:
    if not (isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(x, str) for x in value)):
        raise BadLine(f"`{name}` holds an item that is not a [key, value] pair of strings")
    return value[0], value[1]


def read_rows(path: Path, limit: int, expected: str, build: Callable[[dict[str, Any], int], T]) -> list[T]:
    """build(row, its index) over rows(); a BadLine becomes one line naming the file, the line and what is expected."""
    out: list[T] = []
    for number, row in rows(path, limit, expected):
        try:
            out.append(build(row, len(out)))
        except BadLine as exc:
            raise CtxevalError(f"{path} line {number}: {exc}; expected {expected}") from None
    return out


def litm_file(directory: Path) -> Path:
    found = sorted({p for pattern in LITM_PATTERNS for p in directory.glob(pattern) if p.is_file()})
    if not found:
        raise CtxevalError(
            f"litm:kv: {directory} holds no kv-retrieval-*_keys.jsonl.gz (lost-in-the-middle's kv_retrieval_data/)"
        )
    if len(found) > 1:
        raise CtxevalError(
            f"litm:kv: {directory} holds {len(found)} kv-retrieval files ({', '.join(p.name for p in found)}); "
            "keep the one to run"
        )
    return found[0]


def litm_example(row: dict[str, Any]) -> litm_kv.KvExample:
    raw = row.get("ordered_kv_records")
    if not isinstance(raw, list):
        raise BadLine("`ordered_kv_records` is not a list")
    records = [pair(item, "ordered_kv_records") for item in raw]
    key, value = text_field(row, "key"), text_field(row, "value")
    if (key, value) not in records:
        raise BadLine("the pair [key, value] is not among ordered_kv_records")
    try:
        litm_kv.kv_prompt(records, key)  # the original's checks: unique keys, at least 2 pairs
    except CtxevalError as exc:
        raise BadLine(str(exc)) from None
    return litm_kv.KvExample(records, key, value)


def litm_samples(
    directory: Path, limit: int, depths: tuple[float, ...], wrapper: str = "{task_template}"
) -> list[RulerSample]:
    path = litm_file(directory)
    expected = "ordered_kv_records (a list of [key, value]), key and value, as make_kv_retrieval_data.py writes"
    examples = read_rows(path, limit, expected, lambda row, _: litm_example(row))
    samples = []
    for k, depth in enumerate(check_depths(depths)):
        for j, example in enumerate(examples):
            n = len(example.ordered_kv_records)
            built = litm_kv.kv_sample(example, round(depth / 100 * (n - 1)))
            samples.append(
                RulerSample(
                    k * len(examples) + j, wrap(built.prompt, wrapper), [example.value], -1, "", depth=depth, size=n
                )
            )
    return samples


def helmet_demos(value: Any) -> list[tuple[str, str]]:
    """HELMET's `demos`: load_json_kv reads `for k, v in x["demos"][:shots]`, so a list of [key, value] pairs; a
    string or any other layout is refused rather than guessed at."""
    if not isinstance(value, list):
        raise BadLine(f"`demos` is a {type(value).__name__}, not a list of [key, value] pairs")
    return [pair(item, "demos") for item in value]


def helmet_samples(directory: Path, length: int, limit: int) -> list[RulerSample]:
    if length not in helmet_json_kv.NUM_KVS_LLAMA2:
        known = ", ".join(str(n) for n in helmet_json_kv.NUM_KVS_LLAMA2)
        raise CtxevalError(f"helmet:json_kv: HELMET has no json_kv file for length {length}; its lengths: {known}")
    num_kvs = helmet_json_kv.NUM_KVS_LLAMA2[length]
    path = directory / Path(helmet_json_kv.json_kv_test_file(num_kvs)).name
    expected = "context, demos (a list of [key, value]), question, answer (a string or a list) and depth (0-1)"

    def build(row: dict[str, Any], index: int) -> RulerSample:
        context, question = text_field(row, "context"), text_field(row, "question")
        demos = helmet_demos(row.get("demos"))
        if len(demos) < helmet_json_kv.SHOTS:
            raise BadLine(f"`demos` holds {len(demos)} pairs, fewer than HELMET's {helmet_json_kv.SHOTS} shots")
        answer = row.get("answer")
        if not answer or not isinstance(answer, (str, list)):
            raise BadLine("`answer` is neither a string nor a non-empty list")
        outputs = helmet_json_kv.flatten_ground_truths(answer)
        if not outputs or not all(isinstance(x, str) for x in outputs):
            raise BadLine("`answer` holds something that is not a string")
        depth = row.get("depth")
        if isinstance(depth, bool) or not isinstance(depth, (int, float)) or not 0 <= depth <= 1:
            raise BadLine("`depth` is not a number from 0 to 1 (HELMET's fraction of the context)")
        size = row.get("num_kvs", num_kvs)
        if isinstance(size, bool) or not isinstance(size, int):
            raise BadLine("`num_kvs` is not a whole number")
        prompt = helmet_json_kv.json_kv_prompt(context, demos, question)
        return RulerSample(index, prompt, outputs, -1, "", depth=float(depth) * 100, size=size)

    return read_rows(path, limit, expected, build)


def infbench_answer(task: str, value: Any) -> str:
    """The label as the scorers take it: a list's first element; math_find's number kept as its repr."""
    if isinstance(value, list):
        if not value:
            raise BadLine("`answer` is an empty list")
        value = value[0]
    if task == "infbench:math_find":
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise BadLine("`answer` is not a number")
        text = value if isinstance(value, str) else repr(value)
        if not re.fullmatch(r"-?\d+(\.\d+)?", text.strip()):
            raise BadLine(f"`answer` {text!r} is not a number")
        return text.strip()
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise BadLine("`answer` is not a string")
    return str(value)


def needle_place(context: str, answer: str) -> tuple[float, int]:
    """(depth in percent, noise lines): the needle is the first line holding the answer; the other lines are noise."""
    lines = [line for line in context.split("\n") if line.strip()]
    at = next((i for i, line in enumerate(lines) if answer in line), None)
    if at is None:
        raise BadLine("no line of `context` holds the answer (the needle)")
    noise = len(lines) - 1
    return (at / noise * 100 if noise else 0.0), noise


def kv_place(context: str, question: str) -> tuple[float, int]:
    """(depth in percent, pairs): the queried key's position among the context's JSON pairs."""
    start, end = context.find("{"), context.rfind("}")
    try:
        pairs = json.loads(context[start : end + 1]) if 0 <= start < end else None
    except ValueError:
        pairs = None
    if not isinstance(pairs, dict) or not pairs:
        raise BadLine("`context` holds no JSON object of key-value pairs")
    found = re.search(r'Key: "([^"]*)"', question)
    keys = list(pairs)
    if found is None or found[1] not in pairs:
        raise BadLine('`input` names no key (Key: "...") of the context\'s JSON object')
    return (keys.index(found[1]) / (len(keys) - 1) * 100 if len(keys) > 1 else 0.0), len(keys)


def list_size(context: str) -> int:
    try:
        items = json.loads(context)
    except ValueError:
        items = None
    if not isinstance(items, list):
        raise BadLine("`context` is not a list of numbers (str(list))")
    return len(items)


def infbench_samples(task: str, directory: Path, limit: int) -> list[RulerSample]:
    path = directory / INFBENCH_FILES[task]
    expected = "context, input and answer (a string or number, or a list of them), as InfiniteBench's HF files hold"
    name = task.split(":", 1)[1]

    def build(row: dict[str, Any], index: int) -> RulerSample:
        context, question = text_field(row, "context"), text_field(row, "input")
        answer = infbench_answer(task, row.get("answer"))
        depth: float | None = None
        if name in ("passkey", "number_string"):
            depth, size = needle_place(context, answer)
        elif name == "kv_retrieval":
            depth, size = kv_place(context, question)
        else:
            size = list_size(context)
        prompt = infinitebench.infinitebench_prompt(name, Row(context, question), INFBENCH_TEMPLATE)
        return RulerSample(index, prompt, [answer], -1, "", depth=depth, size=size)

    return read_rows(path, limit, expected, build)


def original_samples(
    task: str,
    directory: Path,
    length: int,
    limit: int,
    depths: tuple[float, ...],
    wrapper: str = "{task_template}",
) -> list[RulerSample]:
    """The prompts of retrieval `task` from the original's released file in `directory` (see the module's note);
    `wrapper` applies to litm:kv, the one whose original wraps an instruct model's prompt."""
    directory = Path(directory)
    if task == "litm:kv":
        return litm_samples(directory, limit, depths, wrapper)
    if task == "helmet:json_kv":
        return helmet_samples(directory, length, limit)
    if task in INFBENCH_FILES:
        return infbench_samples(task, directory, limit)
    raise CtxevalError(f"{task}: no released original file to read; generate its prompts instead (no --samples-from)")
