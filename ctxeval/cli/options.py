"""Shared option types and the parsers of option values. Each option type validates its value in one place: a
`Check` in its Annotated type (ranges and signs, checked by console.user_errors before the command runs, and applied
to preset values too) or its parser (lists, ranges, formats)."""

from __future__ import annotations

import functools
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


# -- methods -------------------------------------------------------------------------------------------------------
MethodOpt = Annotated[
    list[str],
    typer.Option("--method", "-m", help="NAME or NAME:key=value,... (e.g. yarn:factor=4,beta_fast=32); repeatable."),
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


def parse_lengths(text: str) -> list[int]:
    """'2k,4k,8k' | '1024:8192:1024' (linear) | '1k:16k:x2' (geometric); k = 1024."""

    def one(tok: str) -> int:
        try:
            value = parse_token_count(tok, "--lengths")
        except CtxevalError as exc:
            why = (
                " (more than a model can read)"
                if "more than" in str(exc)
                else (" (not a finite number)" if "finite" in str(exc) else "")
            )
            raise CtxevalError(
                f"bad length '{tok.strip()}'{why} in --lengths '{text}'; write e.g. 2k,4k,8k or "
                "1k:16k:x2 (whole numbers of tokens >= 2)"
            ) from None
        if value < 2:
            raise CtxevalError(f"length '{tok.strip()}' must be a whole number of tokens >= 2")
        return value

    values: list[int] = []
    for part in filter(None, (p.strip() for p in str(text).split(","))):
        if ":" in part:
            pieces = part.split(":")
            if len(pieces) != 3:
                raise CtxevalError(f"a length range is START:STOP:STEP or START:STOP:xFACTOR, got '{part}'")
            start, stop, step = one(pieces[0]), one(pieces[1]), pieces[2].strip().lower()
            if step.startswith("x"):
                try:
                    factor = parse_number(step[1:], "a geometric step", "x2") if step[1:] else 0
                except CtxevalError:
                    raise CtxevalError(
                        f"geometric step must be xFACTOR with a finite number > 1 (e.g. x2), got "
                        f"'{step}' in --lengths '{text}'"
                    ) from None
                if factor <= 1:
                    raise CtxevalError(f"geometric step must be > 1, got '{step}'")
                count = math.floor(math.log(max(stop, 1) / start, factor) + 1e-9) + 1 if stop >= start else 0
                if len(values) + count > MAX_LENGTHS:
                    raise CtxevalError(
                        f"--lengths '{text}' gives {count:,} lengths, more than {MAX_LENGTHS:,}; use a larger step"
                    )
                v = float(start)
                while v <= stop + 1e-9:
                    values.append(int(round(v)))
                    v *= factor
            else:
                inc = one(step) if step not in ("0", "1") else int(step)
                if inc < 1:
                    raise CtxevalError(f"length step must be >= 1, got '{step}'")
                if len(values) + max(0, (stop - start) // inc + 1) > MAX_LENGTHS:
                    raise CtxevalError(
                        f"--lengths '{text}' gives {(stop - start) // inc + 1:,} lengths, more than "
                        f"{MAX_LENGTHS:,}; use a larger step"
                    )
                values.extend(range(start, stop + 1, inc))
        else:
            values.append(one(part))
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


# -- model loading ---------------------------------------------------------------------------------------------------
MODEL_HELP = (
    "Hub id (owner/name), local dir, .gguf file, or bundled name: tiny (default; omitting --model also applies "
    "the quickstart settings of ctxeval/tiny/__init__.py) or smollm2."
)
ModelOpt = Annotated[Optional[str], typer.Option("--model", help=MODEL_HELP)]
# commands without quickstart settings (entropy): the same values, tiny when omitted
PlainModelOpt = Annotated[
    Optional[str],
    typer.Option(
        "--model", help="Hub id (owner/name), local dir, .gguf file, or bundled name: tiny (default) or smollm2."
    ),
]
DtypeOpt = Annotated[
    str, typer.Option("--dtype", help="auto|bfloat16|float16|float32 (auto: bf16 on GPU, fp32 on CPU).")
]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto|cpu|cuda|cuda:N")]
AttnOpt = Annotated[str, typer.Option("--attn", help="Attention implementation: sdpa|eager|flash_attention_2.")]
RemoteOpt = Annotated[bool, typer.Option("--trust-remote-code", help="Run the model repository's own code.")]
DeviceMapOpt = Annotated[
    Optional[str],
    typer.Option(
        "--device-map",
        help="auto|balanced|sequential: spread a model too large for one GPU over all visible GPUs (accelerate).",
    ),
]
MaxMemoryOpt = Annotated[
    Optional[str],
    typer.Option("--max-memory", help="With --device-map: memory per device, e.g. 0=70GiB,1=70GiB,cpu=200GiB."),
]

# -- generation backend (needle, passkey, ruler) ----------------------------------------------------------------------
BackendOpt = Annotated[
    str,
    typer.Option(
        "--backend",
        help="hf: transformers' generate (default) | vllm: one vLLM "
        "engine per method, its RoPE read back (pip install 'ctxeval[vllm]').",
    ),
]
TensorParallelOpt = Annotated[
    int, typer.Option(help="vLLM: GPUs per model copy (tensor parallel)."), Check("--tensor-parallel-size", minimum=1)
]
PipelineParallelOpt = Annotated[
    int,
    typer.Option(help="vLLM: pipeline stages (across nodes with Ray)."),
    Check("--pipeline-parallel-size", minimum=1),
]
GpuMemoryOpt = Annotated[
    Optional[float],
    typer.Option(
        help="vLLM: fraction of the device's memory it may take for "
        "weights and KV cache (default 0.9 on GPUs, 0.5 of RAM on "
        "CPU, where vLLM reserves it at start)."
    ),
    Check("--gpu-memory-utilization", above=0, maximum=1),
]
MaxModelLenOpt = Annotated[
    Optional[int],
    typer.Option(help="vLLM: the engine's max_model_len (default: the longest sequence the run needs)."),
    Check("--max-model-len", minimum=2),
]
VllmArgOpt = Annotated[
    Optional[list[str]],
    typer.Option(
        "--vllm-arg",
        help="vLLM engine argument KEY=VALUE (JSON "
        "value or text), repeatable: e.g. max_num_seqs=64, "
        "distributed_executor_backend=ray.",
    ),
]


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


# -- evaluation ------------------------------------------------------------------------------------------------------
DOCS = Check("--docs", minimum=1)
DocsOpt = Annotated[Optional[int], typer.Option(help="Number of documents."), DOCS]
SAMPLES = Check("--samples", minimum=1)
THRESHOLD = Check("--threshold", above=0, maximum=1)
VALID_TOLERANCE = Check("--valid-tolerance", minimum=0)
TextFieldOpt = Annotated[str, typer.Option(help="Record field holding the text.")]
ScoringOpt = Annotated[str, typer.Option(help="generate (greedy + string match) | forced (one teacher-forced pass).")]
MaxNewOpt = Annotated[
    Optional[int],
    typer.Option(help="Generation budget (default: answer tokens + 8)."),
    Check("--max-new-tokens", minimum=1),
]
BatchOpt = Annotated[
    int,
    typer.Option(
        help="Prompts of one length per forward (forced) or per generate call (of one "
        "token length and budget); halved on out of memory."
    ),
    Check("--batch-size", minimum=1),
]
SeedOpt = Annotated[
    int, typer.Option(help="Seed of every random choice (values, keys, depths, offsets)."), Check("--seed", minimum=0)
]
OutOpt = Annotated[Optional[Path], typer.Option(help="Run directory (default runs/<command>-<model>-<time>).")]
OverwriteOpt = Annotated[bool, typer.Option(help="Replace a run directory that holds a different spec.")]
NEEDLE_HELP = (
    "Preset: magic-number, magic-number-multikey, magic-number-multivalue, magic-number-multiquery, passkey, "
    "gkamradt, or a .toml file (RULER itself: ctxeval ruler)."
)
