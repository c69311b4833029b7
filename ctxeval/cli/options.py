"""The options of every command, each declared once, and the parsers of their values. Each option validates its value
in one place: a `Check` in its Annotated type (ranges and signs, checked by console.user_errors before the command
runs, and applied to preset values too) or its parser (lists, ranges, formats). Options that travel together (how the
model loads, what generates) are blocks: dataclasses that `with_blocks` spreads into a command's signature and hands
back to the command as one object."""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import math
import typing
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import numpy as np
import typer

from ..attention.patching import check_temperature
from ..errors import CtxevalError
from ..util.numbers import MAX_TOKENS, parse_number, parse_token_count, parse_whole


@dataclass(frozen=True)
class Check:
    """A numeric option's allowed range: value >= minimum (or > above) and <= maximum. `message` overrides the
    standard '{flag} must be ..., got {value}'."""

    flag: str
    minimum: float | None = None
    above: float | None = None
    maximum: float | None = None
    message: str | None = None

    def __call__(self, value: Any) -> Any:
        if value is None:
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):  # a preset's value may be text
            raise CtxevalError(f"{self.flag} must be a number {self.allowed}, got '{value}'")
        if not math.isfinite(value):
            raise CtxevalError(f"{self.flag} must be a finite number {self.allowed}, got {value}")
        ok = (
            (self.minimum is None or value >= self.minimum)
            and (self.above is None or value > self.above)
            and (self.maximum is None or value <= self.maximum)
        )
        if not ok:
            raise CtxevalError(
                self.message.format(value=value) if self.message else f"{self.flag} must be {self.allowed}, got {value}"
            )
        return value

    @property
    def allowed(self) -> str:
        if self.above is not None and self.maximum is not None:
            return f"in ({self.above:g}, {self.maximum:g}]"
        if self.minimum is not None and self.maximum is not None:
            return f"in [{self.minimum:g}, {self.maximum:g}]"
        return f">= {self.minimum:g}" if self.minimum is not None else f"> {self.above:g}"


@functools.lru_cache(maxsize=None)
def _checks(fn: Callable) -> dict[str, Check]:
    hints = typing.get_type_hints(fn, include_extras=True)
    return {
        name: meta
        for name, hint in hints.items()
        for meta in getattr(hint, "__metadata__", ())
        if isinstance(meta, Check)
    }


def check_options(fn: Callable, values: dict[str, Any]) -> None:
    """Apply the Checks of `fn`'s option types to the values it is called with."""
    for name, check in _checks(fn).items():
        if name in values:
            check(values[name])


class Fmt(str, Enum):
    table = "table"
    json = "json"
    csv = "csv"


# -- numbers ------------------------------------------------------------------------------------------------------
def parse_numbers(text: str | None, flag: str, example: str) -> list[float] | None:
    """'2,4,8' -> [2.0, 4.0, 8.0]; None stays None."""
    if text is None:
        return None
    try:
        values = [parse_number(v, flag, example) for v in str(text).split(",") if v.strip()]
    except CtxevalError:
        raise CtxevalError(f"{flag} takes finite numbers separated by commas (e.g. {example}), got '{text}'") from None
    if not values:
        raise CtxevalError(f"{flag} is empty")
    return values


def parse_factors(text: str | None) -> list[float] | None:
    """--factor 2,4,8 (each factor is checked against the method's own range when the specs are expanded)."""
    return parse_numbers(text, "--factor", "2,4,8")


def parse_temperatures(text: str | None) -> list[float] | None:
    """--attention-temperature 1,1.1,1.2 -> [1.0, 1.1, 1.2] (each > 0)."""
    values = parse_numbers(text, "--attention-temperature", "1,1.2")
    return None if values is None else [check_temperature(v) for v in values]


# -- lengths and depths ----------------------------------------------------------------------------------------------
MAX_LENGTHS = 10_000  # lengths (or depths) one option may list: a range that would give more is a typo


def parse_length(token: str, text: str) -> int:
    """One length of --lengths `text`: a whole number of tokens >= 2 (k = 1024)."""
    try:
        value = parse_token_count(token, "--lengths")
    except CtxevalError as exc:
        why = (
            " (more than a model can read)"
            if "more than" in str(exc)
            else (" (not a finite number)" if "finite" in str(exc) else "")
        )
        raise CtxevalError(
            f"bad length '{token.strip()}'{why} in --lengths '{text}'; write e.g. 2k,4k,8k or "
            "1k:16k:x2 (whole numbers of tokens >= 2)"
        ) from None
    if value < 2:
        raise CtxevalError(f"length '{token.strip()}' must be a whole number of tokens >= 2")
    return value


def length_range(part: str, text: str, before: int) -> list[int]:
    """START:STOP:STEP (linear) or START:STOP:xFACTOR (geometric) of --lengths `text`, after `before` lengths."""
    pieces = part.split(":")
    if len(pieces) != 3:
        raise CtxevalError(f"a length range is START:STOP:STEP or START:STOP:xFACTOR, got '{part}'")
    start, stop, step = parse_length(pieces[0], text), parse_length(pieces[1], text), pieces[2].strip().lower()
    if step.startswith("x"):
        try:
            factor = parse_number(step[1:], "a geometric step", "x2") if step[1:] else 0
        except CtxevalError:
            raise CtxevalError(
                f"geometric step must be xFACTOR with a finite number > 1 (e.g. x2), got '{step}' in --lengths '{text}'"
            ) from None
        if factor <= 1:
            raise CtxevalError(f"geometric step must be > 1, got '{step}'")
        count = math.floor(math.log(max(stop, 1) / start, factor) + 1e-9) + 1 if stop >= start else 0
        if before + count > MAX_LENGTHS:
            raise CtxevalError(
                f"--lengths '{text}' gives {count:,} lengths, more than {MAX_LENGTHS:,}; use a larger step"
            )
        values, v = [], float(start)
        while v <= stop + 1e-9:
            values.append(int(round(v)))
            v *= factor
        return values
    inc = parse_length(step, text) if step not in ("0", "1") else int(step)
    if inc < 1:
        raise CtxevalError(f"length step must be >= 1, got '{step}'")
    if before + max(0, (stop - start) // inc + 1) > MAX_LENGTHS:
        raise CtxevalError(
            f"--lengths '{text}' gives {(stop - start) // inc + 1:,} lengths, more than {MAX_LENGTHS:,}; use a larger step"
        )
    return list(range(start, stop + 1, inc))


def parse_lengths(text: str) -> list[int]:
    """'2k,4k,8k' | '1024:8192:1024' (linear) | '1k:16k:x2' (geometric); k = 1024."""
    values: list[int] = []
    for part in filter(None, (p.strip() for p in str(text).split(","))):
        values.extend(length_range(part, text, len(values)) if ":" in part else [parse_length(part, text)])
        if len(values) > MAX_LENGTHS:
            raise CtxevalError(f"--lengths gives more than {MAX_LENGTHS:,} lengths; measure fewer at a time")
    if not values:
        raise CtxevalError("--lengths is empty; write e.g. 2k,4k,8k")
    return sorted(set(values))


def sigmoid_depths(count: int) -> list[float]:
    """Depths packed towards 0% and 100%, as the original needle test's sigmoid spacing."""
    if count == 1:
        return [50.0]
    x = np.linspace(-4, 4, count)
    s = 1 / (1 + np.exp(-x))
    return [round(float(v), 2) for v in 100 * (s - s[0]) / (s[-1] - s[0])]


def parse_depths(text: str, spacing: str) -> list[float]:
    """'0,50,100' | '0:100:11' (start:stop:count); --depth-spacing sigmoid packs count depths towards the ends."""
    if spacing not in ("linear", "sigmoid"):
        raise CtxevalError(f"--depth-spacing must be linear or sigmoid, got '{spacing}'")
    try:
        if ":" in text:
            start, stop, count = text.split(":")
            start, stop, n = float(start), float(stop), int(count)
            if n < 1 or n > MAX_LENGTHS:
                raise ValueError
            if spacing == "sigmoid":
                values = [start + (stop - start) * d / 100 for d in sigmoid_depths(n)]
            else:
                values = [start + (stop - start) * i / max(n - 1, 1) for i in range(n)] if n > 1 else [start]
        else:
            values = [float(v) for v in text.split(",") if v.strip()]
            if len(values) > MAX_LENGTHS:
                raise ValueError
            if spacing == "sigmoid":
                raise CtxevalError("--depth-spacing sigmoid needs a START:STOP:COUNT range in --depths")
    except ValueError:
        raise CtxevalError(f"bad --depths '{text}'; write 0,50,100 or 0:100:11") from None
    bad = [v for v in values if not 0 <= v <= 100]  # NaN and infinities too
    if bad:
        raise CtxevalError(f"depths are percentages in 0..100, got {bad[0]:g}")
    values = sorted({round(v, 2) for v in values})
    if not values:
        raise CtxevalError("--depths is empty")
    return values


def parse_indices(text: str | None, flag: str) -> tuple[int, ...] | None:
    """--layers / --heads: 'all' (None) or indices >= 0 separated by commas."""
    if text is None or text.strip().lower() == "all":
        return None
    try:
        values = tuple(sorted({parse_whole(v, flag, maximum=MAX_TOKENS) for v in text.split(",") if v.strip()}))
    except CtxevalError:
        raise CtxevalError(f"{flag} takes 'all' or indices separated by commas (e.g. 0,3,7), got '{text}'") from None
    if not values or min(values) < 0:
        raise CtxevalError(f"{flag} takes 'all' or indices >= 0, got '{text}'")
    return values


def parse_vllm_args(items: list[str] | None) -> dict[str, Any]:
    """--vllm-arg KEY=VALUE pairs; a value is read as JSON (true, 64, 0.5, {"a": 1}) and as text otherwise."""
    import json

    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key.isidentifier():
            raise CtxevalError(f"--vllm-arg '{item}': write KEY=VALUE, e.g. --vllm-arg max_num_seqs=64")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


# -- the options: each declared once, here -------------------------------------------------------------------------
# A command whose option means the same but reads differently (its own default, its own range) rewords it; the name,
# and what typer makes of it, stay declared here. tests/test_cli_structure.py holds every option name to one place.


def reworded(
    option: Any, help: str, hint: Any = None, check: Check | None = None, *, short: str = "", negatable: bool = False
) -> Any:
    """`option` (an Annotated option type) with another help text; `hint` replaces its value type, `check` its Check,
    `short` adds a one-letter name, `negatable` the --no- form of a flag."""
    value_type, info, *extras = typing.get_args(option)
    info = copy.copy(info)  # typer.Option("--name", ...): the first name is held as `default` until typer reads it
    info.help = help
    if negatable:
        info.default = f"{info.default}/--no-{info.default[2:]}"
    if short:
        info.param_decls = (*info.param_decls, short)
    if check is not None:
        extras = [check if isinstance(extra, Check) else extra for extra in extras]
    return Annotated[(value_type if hint is None else hint, info, *extras)]


DOCS = Check("--docs", minimum=1)
SAMPLES = Check("--samples", minimum=1)
THRESHOLD = Check("--threshold", above=0, maximum=1)
VALID_TOLERANCE = Check("--valid-tolerance", minimum=0)
DATA_HELP = "pydoc (default) | austen | mobydick | files/dirs/globs | hf:NAME[:CONFIG][@SPLIT]"
MODEL_HELP = (
    "Hub id (owner/name), local dir, .gguf file, or bundled name: tiny (default; omitting --model also applies "
    "the quickstart settings of ctxeval/tiny/__init__.py) or smollm2."
)
NEEDLE_HELP = (
    "Preset: magic-number, magic-number-multikey, magic-number-multivalue, magic-number-multiquery, passkey, "
    "gkamradt, or a .toml file (RULER itself: ctxeval ruler)."
)

ModelOpt = Annotated[Optional[str], typer.Option("--model", help=MODEL_HELP)]
# ppl, needle and passkey: several models in one command, each its own run, merged into one report
ModelsOpt = reworded(
    ModelOpt,
    "Hub id (owner/name), local dir, .gguf file, or bundled name: tiny (default; omitting --model also applies the "
    "quickstart settings of ctxeval/tiny/__init__.py), smollm2, tiny's position-encoding family (tiny-nope, "
    "tiny-rope-gpt, tiny-alibi, tiny-learned, tiny-sinusoidal). Repeatable, or tiny-family for tiny and its "
    "family: one run per model under --out, merged into one table.",
    Optional[list[str]],
)
# commands without quickstart settings (entropy, ruler, lm-eval): the same values, tiny when omitted
PlainModelOpt = reworded(
    ModelOpt, "Hub id (owner/name), local dir, .gguf file, or bundled name: tiny (default) or smollm2."
)
MethodOpt = Annotated[
    Optional[list[str]],
    typer.Option("--method", "-m", help="NAME or NAME:key=value,...; repeatable (default none)."),
]
FactorOpt = Annotated[
    Optional[str],
    typer.Option(
        "--factor",
        help="Scale s for every method that takes one; a list sweeps: 2,4,8 "
        "(default: pi, ntk, ntk-by-parts and yarn take the longest length "
        "/ the trained length).",
    ),
]
TemperatureOpt = Annotated[
    Optional[str],
    typer.Option(
        "--attention-temperature",
        help="Multiply every attention logit by LAMBDA (any model, RoPE or not; "
        "1 = unchanged); a list sweeps: 1,1.1,1.2.",
    ),
]
LengthsOpt = Annotated[
    Optional[str],
    typer.Option(
        "--lengths",
        help="Context lengths in tokens: 1k,2k,4k | 1k:16k:x2 "
        "(default: 0.25x, 0.5x, 1x, 2x the model's original length).",
    ),
]
DepthsOpt = Annotated[
    str, typer.Option("--depths", help="Needle depths in percent: 0,50,100 | 0:100:11 (start:stop:count).")
]
TasksOpt = Annotated[
    str,
    typer.Option(
        "--tasks", help="lm-eval task, group or tag names, comma-separated (e.g. longbench_narrativeqa,ruler)."
    ),
]
DataOpt = Annotated[Optional[str], typer.Option("--data", help=DATA_HELP)]
TextFieldOpt = Annotated[str, typer.Option("--text-field", help="Record field holding the text.")]
DocsOpt = Annotated[Optional[int], typer.Option("--docs", help="Number of documents."), DOCS]
BosOpt = Annotated[bool, typer.Option("--bos/--no-bos", help="Start each sequence with the tokenizer's BOS.")]
ProtocolOpt = Annotated[Optional[str], typer.Option("--protocol", help="truncate (YaRN paper) | sliding.")]
AggregateOpt = Annotated[
    Optional[str], typer.Option("--aggregate", help="token (token-weighted) | window (mean of window means).")
]
HaystackOpt = Annotated[
    str, typer.Option("--haystack", help="pydoc | filler | austen | mobydick | files | hf:NAME (any --data spec).")
]
ChatTemplateOpt = Annotated[
    str, typer.Option("--chat-template", help="auto | on | off: wrap as a user turn, prefill the answer prefix.")
]
ScoringOpt = Annotated[
    str, typer.Option("--scoring", help="generate (greedy + string match) | forced (one teacher-forced pass).")
]
SamplesOpt = Annotated[
    Optional[int],
    typer.Option("--samples", help="Samples per cell, each with its own seeded needle and offset (default 1)."),
    SAMPLES,
]
MaxNewOpt = Annotated[
    Optional[int],
    typer.Option("--max-new-tokens", help="Generation budget (default: answer tokens + 8)."),
    Check("--max-new-tokens", minimum=1),
]
ChunkOpt = Annotated[
    int,
    typer.Option("--chunk-size", help="Positions per LM-head chunk (memory vs. speed)."),
    Check("--chunk-size", minimum=1),
]
BatchOpt = Annotated[
    int,
    typer.Option(
        "--batch-size",
        help="Prompts of one length per forward (forced) or per generate call (of one "
        "token length and budget); halved on out of memory.",
    ),
    Check("--batch-size", minimum=1),
]
ThresholdOpt = Annotated[
    float, typer.Option("--threshold", help="Accuracy that counts for the effective length."), THRESHOLD
]
ValidToleranceOpt = Annotated[
    float,
    typer.Option("--valid-tolerance", help="Valid-length table: allowed ppl rise over the original length."),
    VALID_TOLERANCE,
]
SeedOpt = Annotated[
    int,
    typer.Option("--seed", help="Seed of every random choice (values, keys, depths, offsets)."),
    Check("--seed", minimum=0),
]
OutOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--out", help="Run directory (default runs/<command>-<model>-<key>: the same command again resumes it)."
    ),
]
OverwriteOpt = Annotated[
    bool, typer.Option("--overwrite/--no-overwrite", help="Replace a run directory that holds a different spec.")
]
FormatOpt = Annotated[Fmt, typer.Option("--format", help="table, json or csv")]
HeadDimOpt = Annotated[
    Optional[int],
    typer.Option("--head-dim", help="Rotary dim d (head_dim x partial_rotary_factor), e.g. 128."),
]
RemoteOpt = Annotated[bool, typer.Option("--trust-remote-code", help="Run the model repository's own code.")]


# -- blocks: options that travel together, handed to a command as one object ------------------------------------------
@dataclass(frozen=True)
class Load:
    """How the model loads (models.load.load_model's options)."""

    dtype: Annotated[
        str, typer.Option("--dtype", help="auto|bfloat16|float16|float32 (auto: bf16 on GPU, fp32 on CPU).")
    ] = "auto"
    device: Annotated[str, typer.Option("--device", help="auto|cpu|cuda|cuda:N")] = "auto"
    attn: Annotated[str, typer.Option("--attn", help="Attention implementation: sdpa|eager|flash_attention_2.")] = (
        "sdpa"
    )
    trust_remote_code: RemoteOpt = False
    device_map: Annotated[
        Optional[str],
        typer.Option(
            "--device-map",
            help="auto|balanced|sequential: spread a model too large for one GPU over all visible GPUs (accelerate).",
        ),
    ] = None
    max_memory: Annotated[
        Optional[str],
        typer.Option("--max-memory", help="With --device-map: memory per device, e.g. 0=70GiB,1=70GiB,cpu=200GiB."),
    ] = None


BACKENDS = ("hf", "vllm")


@dataclass(frozen=True)
class Engine:
    """What generates (needle, passkey, ruler, lm-eval): transformers' generate (hf) or vLLM, with vLLM's engine
    options."""

    backend: Annotated[
        str,
        typer.Option(
            "--backend",
            help="hf: transformers' generate (default) | vllm: one vLLM "
            "engine per method, its RoPE read back (pip install 'ctxeval[vllm]').",
        ),
    ] = "hf"
    tensor_parallel_size: Annotated[
        int,
        typer.Option("--tensor-parallel-size", help="vLLM: GPUs per model copy (tensor parallel)."),
        Check("--tensor-parallel-size", minimum=1),
    ] = 1
    pipeline_parallel_size: Annotated[
        int,
        typer.Option("--pipeline-parallel-size", help="vLLM: pipeline stages (across nodes with Ray)."),
        Check("--pipeline-parallel-size", minimum=1),
    ] = 1
    gpu_memory_utilization: Annotated[
        Optional[float],
        typer.Option(
            "--gpu-memory-utilization",
            help="vLLM: fraction of the device's memory it may take for "
            "weights and KV cache (default 0.9 on GPUs, 0.5 of RAM on "
            "CPU, where vLLM reserves it at start).",
        ),
        Check("--gpu-memory-utilization", above=0, maximum=1),
    ] = None
    max_model_len: Annotated[
        Optional[int],
        typer.Option(
            "--max-model-len", help="vLLM: the engine's max_model_len (default: the longest sequence the run needs)."
        ),
        Check("--max-model-len", minimum=2),
    ] = None
    vllm_arg: Annotated[
        Optional[list[str]],
        typer.Option(
            "--vllm-arg",
            help="vLLM engine argument KEY=VALUE (JSON "
            "value or text), repeatable: e.g. max_num_seqs=64, "
            "distributed_executor_backend=ray.",
        ),
    ] = None

    def check(self) -> None:
        if self.backend not in BACKENDS:
            raise CtxevalError(f"--backend must be hf or vllm, got '{self.backend}'")
        if self.backend == "hf":
            given = [
                flag
                for flag, on in (
                    ("--tensor-parallel-size", self.tensor_parallel_size != 1),
                    ("--pipeline-parallel-size", self.pipeline_parallel_size != 1),
                    ("--gpu-memory-utilization", self.gpu_memory_utilization is not None),
                    ("--max-model-len", self.max_model_len is not None),
                    ("--vllm-arg", bool(self.vllm_arg)),
                )
                if on
            ]
            if given:
                raise CtxevalError(f"{given[0]} is an option of --backend vllm")


@dataclass(frozen=True)
class Omit:
    """Annotated[Block, Omit("name", ...)]: the block without those options (the object holds their defaults)."""

    names: tuple[str, ...]

    def __init__(self, *names: str) -> None:
        object.__setattr__(self, "names", names)


def block_of(hint: Any) -> tuple[type | None, tuple[str, ...]]:
    """(the block, the names it omits) when `hint` is a block (a dataclass of options, maybe Annotated with Omit);
    (None, ()) for an option."""
    omit = next((m.names for m in getattr(hint, "__metadata__", ()) if isinstance(m, Omit)), ())
    inner = typing.get_args(hint)[0] if omit else hint
    return (inner, omit) if dataclasses.is_dataclass(inner) else (None, ())


def block_parameters(block: type, omit: tuple[str, ...] = ()) -> list[inspect.Parameter]:
    """The options of `block` as a command's parameters, in field order; a field that is a block gives its own."""
    hints = typing.get_type_hints(block, include_extras=True)
    params: list[inspect.Parameter] = []
    for f in dataclasses.fields(block):
        inner, inner_omit = block_of(hints[f.name])
        if f.name in omit:
            continue
        if inner is not None:
            params += block_parameters(inner, inner_omit)
        else:
            default = inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default
            params.append(
                inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=hints[f.name])
            )
    return params


def build_block(block: type, values: dict[str, Any], omit: tuple[str, ...] = ()) -> Any:
    """The `block` object from a command's option values."""
    hints = typing.get_type_hints(block, include_extras=True)
    given = {}
    for f in dataclasses.fields(block):
        inner, inner_omit = block_of(hints[f.name])
        if f.name not in omit:
            given[f.name] = build_block(inner, values, inner_omit) if inner is not None else values[f.name]
    return block(**given)


def with_blocks(command: Callable[..., Any]) -> Callable[..., Any]:
    """typer reads a command's options from its signature: each parameter of `command` whose type is a block (a
    dataclass of options, maybe Annotated with Omit) is replaced there by the block's options, and the command is
    called with one block object for it."""
    params = inspect.signature(command, eval_str=True).parameters.values()
    blocks = {p.name: block_of(p.annotation) for p in params if block_of(p.annotation)[0] is not None}
    flat = [
        q.replace(kind=inspect.Parameter.KEYWORD_ONLY)  # typer passes every option by name
        for p in params
        for q in (block_parameters(*blocks[p.name]) if p.name in blocks else [p])
    ]

    @functools.wraps(command)
    def call(**values: Any) -> Any:
        for name, (block, omit) in blocks.items():
            built = build_block(block, values, omit)
            for q in block_parameters(block, omit):
                values.pop(q.name)
            values[name] = built
        return command(**values)

    call.__signature__ = inspect.Signature(flat)  # type: ignore[attr-defined]
    call.__annotations__ = {q.name: q.annotation for q in flat}
    return call
