"""What `ctxeval tune` searches: a method's parameters turned into a search space, and a point of it back into a method.

Types, lower bounds and the checks between parameters are the methods' own (`methods.Param`,
`attention_methods.AttentionMethod`, `resolve_params`); the upper ranges searched are declared here, beside the reason
for each. A parameter the user fixed in the spec (`yarn:beta_fast=4`) is not searched. The factor is fixed at target /
trained length unless --search-factor asks for it.

LongRoPE's long factors are searched as one value per rotary pair in [1, 1 + s] (LongRoPE's `dim_mono` range), kept
non-decreasing over the pairs: a point is mapped to its running maximum, so any point the optimiser proposes is a
valid monotone factor list (LongRoPE's own code redraws a mutation until it is monotone instead). The short factors
(used up to the trained length, as Phi-3's configs hold them) stay 1, plain RoPE, unless --space short_factor=LOW:HIGH
searches them the same way; they change only the guard, since the target's forward uses the long ones. LongRoPE's
start tokens (start_token_idx: positions kept at plain RoPE) are searched from 0 to min(256, L / 8), except for
--export: no transformers or vLLM config holds them.

YaRN's beta_slow is searched as a fraction of beta_fast (`beta_slow_ratio`), so that every point is a ramp the method
accepts (beta_slow < beta_fast): searched as two free ranges, a third of the points broke that check. A range given
for beta_slow itself (--space beta_slow=...) searches it as given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ...attention.methods import AttentionSpec, check_combination, get_attention_method, resolve_attention
from ...errors import CtxevalError
from ...rope.methods import START_TOKENS, Geometry, compute, yarn_ramp
from ...rope.params import Param
from ...specs import MethodSpec, default_factor, format_param


@dataclass(frozen=True)
class Range:
    """A searched range: [low, high] (times the factor s or the trained length L when `per` says so)."""

    low: float
    high: float
    log: bool = False
    per: str = ""  # "" (absolute) | "factor" | "length"


_BETAS = {
    # YaRN's ramp is in rotations over L: the fastest pair turns L / 2 pi times (20 at L = 128, 1,300 at 8k), so the
    # paper's 32 / 1 suit a 4k model and a short one needs smaller values (the bundled model's hand-tuned 4 / 0.25)
    "beta_fast": Range(0.5, 128.0, log=True),  # rotations over L above which pairs keep their frequency
    "beta_slow": Range(0.01, 16.0, log=True),  # rotations over L below which pairs are interpolated
}
# beta_slow / beta_fast: YaRN's 1 / 32 and the bundled model's hand-tuned 0.25 / 4 lie inside; above 0.9 the ramp is a
# step, below 1 / 1024 it spans more pairs than a model has
BETA_SLOW_RATIO = "beta_slow_ratio"
_RATIO = Range(1 / 1024, 0.9, log=True)
_ATTENTION_FACTOR = Range(0.8, 1.6)  # q/k multiplier (YaRN's default 0.1 ln s + 1 is 1.21 at s = 8)
RANGES: dict[str, dict[str, Range]] = {
    "yarn": {**_BETAS, "attention_factor": _ATTENTION_FACTOR},
    "ntk-by-parts": dict(_BETAS),
    # not its attention factor: a value given replaces the per-length 0.1 ln s + 1 by a constant, another method
    "dynamic-yarn": dict(_BETAS),
    # the NTK post's alpha is the scale whose base change is applied; the useful alpha is often above s
    "ntk": {"alpha": Range(0.5, 4.0, log=True, per="factor")},  # NTK scale, from s/2 to 4s
    # NTK-mixed's exponent: pair j / s^((j/(d/2))^b); 1 is vLLM's plain ntk, b < 1 interpolates the middle pairs more,
    # b > 1 keeps more of them near their own frequency (Su's post compares values either side of 1)
    "ntk-mixed": {"mixed_b": Range(0.25, 4.0, log=True)},
    # LongRoPE's per-pair long factors are dims of their own (below); its attention factor sqrt(1 + ln s / ln L)
    # multiplies q and k at every length in transformers' longrope, so it alone decides the ppl up to L (short factors
    # 1): searched, or the guard could never be met where the default raises the short ppl
    "longrope": {"attention_factor": Range(0.8, 1.6)},  # default sqrt(1 + ln s / ln L)
    "llama3": {"low_freq_factor": Range(0.25, 8.0, log=True), "high_freq_factor": Range(1.0, 64.0, log=True)},
    "self-extend": {
        "group_size": Range(2, 64, log=True),
        "neighbor_window": Range(1 / 16, 1.0, log=True, per="length"),
    },
    "rerope": {"window": Range(1 / 16, 1.0, log=True, per="length")},
    "leaky-rerope": {"window": Range(1 / 16, 1.0, log=True, per="length"), "k": Range(1.0, 64.0, log=True)},
    # DCA: ChunkLlama's chunk 3L/4 and local L/8 are the middle of these; a chunk at most L keeps every relative
    # position a trained one (a point with local >= chunk is refused by the method's own check)
    "dca": {
        "chunk_size": Range(0.5, 1.0, per="length"),
        "local_size": Range(1 / 64, 1 / 4, log=True, per="length"),
    },
    # STRING: the authors suggest a shift of 0.25-0.4 L and a local W of 128-512 at L = 128k (1/1024-1/256 of L)
    "string": {
        "shift": Range(0.1, 0.6, per="length"),
        "local": Range(1 / 1024, 1 / 16, log=True, per="length"),
    },
    # query temperatures: Llama 4 and Mistral ship 0.1 for both coefficients; from a tenth of it to ten times
    "qscale-llama4": {"attn_scale": Range(0.01, 1.0, log=True)},
    "qscale-mistral": {"beta": Range(0.01, 1.0, log=True)},
}
FACTOR_RANGE = Range(0.5, 2.0, log=True, per="factor")  # --search-factor: from s/2 to 2s (at least 1)
LONG_FACTOR = "long_factor"
SHORT_FACTOR = "short_factor"
FACTOR_LISTS = (LONG_FACTOR, SHORT_FACTOR)
# LongRoPE's start tokens: up to 256 (the largest count its paper tries), at most an eighth of the trained length
START_TOKENS_MAX = 256


@dataclass(frozen=True)
class Dim:
    """One searched coordinate. `owner` is '' for the frequency method or an attention method's name."""

    owner: str
    name: str
    kind: type  # float or int
    low: float
    high: float
    log: bool

    @property
    def key(self) -> str:
        return f"{self.owner}.{self.name}" if self.owner else self.name


@dataclass(frozen=True)
class SearchSpace:
    base: MethodSpec  # the spec as given (its parameters are fixed), with the factor set
    dims: tuple[Dim, ...]
    factor: float
    pairs: int  # rotary pairs (LongRoPE's factor count)

    @property
    def vector(self) -> bool:
        """Whether the space is LongRoPE's per-pair factors."""
        return self.base.name == "longrope"

    def lists(self) -> tuple[str, ...]:
        """LongRoPE's searched factor lists: long_factor, and short_factor unless the spec fixed it."""
        keys = {d.name.split(".")[0] for d in self.dims}
        return tuple(name for name in FACTOR_LISTS if name in keys) if self.vector else ()

    def snap(self, point: dict[str, Any]) -> dict[str, Any]:
        """The point a trial measures: LongRoPE's factors on its 0.01 grid (`list_step`), other real values to 4
        significant digits (labels stay readable; two trials closer than that measure the same method)."""
        out = {}
        for dim in self.dims:
            value = point[dim.key]
            if dim.kind is int:
                out[dim.key] = int(value)
            elif self.vector and dim.name.split(".")[0] in FACTOR_LISTS:
                out[dim.key] = min(dim.high, max(dim.low, round(float(value), 2)))
            else:
                out[dim.key] = min(dim.high, max(dim.low, float(f"{float(value):.4g}")))
        return out

    def spec(self, point: dict[str, Any]) -> MethodSpec:
        """The method at a point of the space (validated: a CtxevalError says why the point is not a valid method)."""
        params = dict(self.base.params)
        attention = {a.name: dict(a.given) for a in self.base.attention}
        for name in self.lists():
            params[name] = monotone([point[f"{name}.{i}"] for i in range(self.pairs)])
        for dim in self.dims:
            if (self.vector and dim.name.split(".")[0] in FACTOR_LISTS) or dim.name == BETA_SLOW_RATIO:
                continue
            value = int(point[dim.key]) if dim.kind is int else float(point[dim.key])
            (attention[dim.owner] if dim.owner else params)[dim.name] = value
        if BETA_SLOW_RATIO in point:
            params["beta_slow"] = float(f"{float(point[BETA_SLOW_RATIO]) * float(params['beta_fast']):.4g}")
        frequency = MethodSpec(self.base.name, params, self.base.temperature)  # its parameters checked first
        specs = tuple(resolve_attention(name, given) for name, given in attention.items())
        check_combination(specs)
        return replace(frequency, attention=specs)


RATIO_PARAM = Param(BETA_SLOW_RATIO, float, 1 / 32, "beta_slow as a fraction of beta_fast", positive=True)


def monotone(values: list[float]) -> tuple[float, ...]:
    """The running maximum: the smallest non-decreasing list >= `values` element by element."""
    return tuple(float(v) for v in np.maximum.accumulate(np.asarray(values, dtype=np.float64)))


def _bounds(owner: str, p: Param, r: Range, factor: float, length: int) -> tuple[float, float]:
    scale = factor if r.per == "factor" else length if r.per == "length" else 1.0
    low, high = r.low * scale, r.high * scale
    if p.minimum is not None:
        low = max(low, p.minimum)
    if p.kind is int:
        low, high = math.ceil(low), math.floor(high)
    return low, high


def check_bounds(owner: str, p: Param, low: float, high: float) -> None:
    """Bounds a user gave (--space) against the parameter's own checks: one line naming what to change."""
    where = f"--space {(owner + '.') if owner else ''}{p.name}"
    if not (math.isfinite(low) and math.isfinite(high)) or low >= high:
        raise CtxevalError(f"{where}: give LOW:HIGH with LOW < HIGH, got {low:g}:{high:g}")
    if p.minimum is not None and low < p.minimum:
        raise CtxevalError(f"{where}: {p.name} must be >= {p.minimum:g} ({p.help}); the range starts at {low:g}")
    if p.positive and low <= 0:
        raise CtxevalError(f"{where}: {p.name} must be > 0 ({p.help}); the range starts at {low:g}")
    if p.name == BETA_SLOW_RATIO and high >= 1:
        raise CtxevalError(
            f"{where}: beta_slow must stay below beta_fast, so the ratio below 1; the range ends at {high:g}"
        )
    if p.kind is int and math.floor(high) < math.ceil(low):
        raise CtxevalError(f"{where}: {p.name} is a whole number and {low:g}:{high:g} holds none")


def parse_overrides(texts: list[str]) -> dict[str, tuple[float, float, bool]]:
    """--space NAME=LOW:HIGH[:log] (repeatable) -> {key: (low, high, log)}."""
    out = {}
    for text in texts:
        key, eq, rest = text.partition("=")
        parts = rest.split(":")
        try:
            if not eq or len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("log", "linear")):
                raise ValueError
            out[key.strip()] = (float(parts[0]), float(parts[1]), len(parts) == 3 and parts[2] == "log")
        except ValueError:
            raise CtxevalError(
                f"--space '{text}': write NAME=LOW:HIGH or NAME=LOW:HIGH:log (e.g. beta_fast=1:64:log, "
                "self-extend.group_size=2:32)"
            ) from None
    return out


def build_space(
    spec: MethodSpec,
    geometry: Geometry,
    target: int,
    search_factor: bool = False,
    overrides: dict[str, tuple[float, float, bool]] | None = None,
    start_tokens: bool = True,
) -> SearchSpace:
    """The search space of `spec` for extending `geometry` to `target` tokens. `start_tokens`: whether LongRoPE's
    start_token_idx is searched (not for --export: no transformers or vLLM config holds it)."""
    overrides = dict(overrides or {})
    method = spec.method
    trained = int(spec.params.get("original_max_position_embeddings") or geometry.original_length)
    if target <= trained:
        raise CtxevalError(
            f"--target-length {target:,} is not beyond the trained length {trained:,}: tune searches an "
            f"extension; give a longer target (e.g. --target-length {trained * 4:,})"
        )
    factor = float(spec.params.get("factor") or default_factor(target, trained))
    params = dict(spec.params)
    fixed = {method.param_aliases.get(k, k) for k in spec.params}
    # ntk's alpha (searched, or given) and base replace its factor: the two together are refused by its checks
    if method.takes_factor and "factor" not in params and not (spec.name == "ntk" and "factor" not in fixed):
        params["factor"] = factor
    dims: list[Dim] = []

    def add(owner: str, p: Param, r: Range) -> None:
        key = f"{owner}.{p.name}" if owner else p.name
        if key in overrides:
            low, high, log = overrides.pop(key)
            check_bounds(owner, p, low, high)
        else:
            (low, high), log = _bounds(owner, p, r, factor, trained), r.log
        dims.append(Dim(owner, p.name, int if p.kind is int else float, float(low), float(high), log))

    for name, r in RANGES.get(spec.name, {}).items():
        if name not in fixed and not (spec.name == "ntk" and fixed & {"base", "factor"}):
            if name == "beta_slow" and "beta_slow" not in overrides:
                add("", RATIO_PARAM, _RATIO)  # beta_slow = ratio x beta_fast: never a refused ramp
            else:
                add("", method.param(name), r)
    # ntk's factor is its alpha (searched already): the two together are refused by its checks
    if search_factor and method.takes_factor and "factor" not in spec.params and spec.name != "ntk":
        add("", method.param("factor"), FACTOR_RANGE)
    pairs = geometry.rotary_dim // 2
    if spec.name == "longrope":
        if "long_factor" in spec.params:
            raise CtxevalError(
                "tune searches longrope's long_factor: leave it out of the spec (short_factor is 1 for every "
                "pair, plain RoPE up to the trained length, unless given, or searched with --space "
                "short_factor=1:2)"
            )
        if len(params.get(SHORT_FACTOR) or ()) == 1:  # one value given: every pair's
            params[SHORT_FACTOR] = tuple(params[SHORT_FACTOR]) * pairs
        dims += [Dim("", f"{LONG_FACTOR}.{i}", float, 1.0, 1.0 + factor, False) for i in range(pairs)]
        if SHORT_FACTOR in overrides:  # --space short_factor=LOW:HIGH: the short factors searched, per pair
            if SHORT_FACTOR in spec.params:
                raise CtxevalError(
                    "--space short_factor searches the short factors that the spec fixes: give one of them"
                )
            low, high, log = overrides.pop(SHORT_FACTOR)
            check_bounds("", Param(SHORT_FACTOR, float, None, "per-pair factors up to L", positive=True), low, high)
            dims += [Dim("", f"{SHORT_FACTOR}.{i}", float, low, high, log) for i in range(pairs)]
        else:  # plain RoPE up to the trained length: the guard's own reference
            params.setdefault(SHORT_FACTOR, tuple([1.0] * pairs))
        if start_tokens and START_TOKENS not in fixed and trained // 8 >= 1:
            add("", method.param(START_TOKENS), Range(0, min(START_TOKENS_MAX, trained // 8)))
    for a in spec.attention:
        am = get_attention_method(a.name)
        for name, r in RANGES.get(a.name, {}).items():
            if name not in a.given:
                add(a.name, am.param(name), r)
    if overrides:
        known = ", ".join(d.key for d in dims) or "none"
        raise CtxevalError(
            f"--space {', '.join(overrides)}: not a searched parameter of {spec.label} (searched: {known})"
        )
    if not dims:
        what = (
            "every searchable parameter is fixed in the spec"
            if RANGES.get(spec.name) or spec.attention
            else f"{spec.name} has no parameter to search besides its factor"
            if method.takes_factor
            else f"{spec.name} has no parameter to search"
        )
        offer = "--search-factor, or " if method.takes_factor and not search_factor and "factor" not in fixed else ""
        raise CtxevalError(
            f"tune {spec.label}: {what}; use {offer}a method with searchable parameters (yarn, ntk, "
            "llama3, longrope, dynamic-yarn, ntk-by-parts, or +self-extend/+rerope/+leaky-rerope)"
        )
    base = MethodSpec(spec.name, params, spec.temperature, spec.attention)
    return SearchSpace(base, tuple(dims), factor, pairs)


# YaRN's 32 / 1 were chosen on Llama 2: head dim 128, base 10,000, 4,096 trained tokens
YARN_REFERENCE = Geometry(128, 10000.0, 4096)
YARN_DEFAULT_BETAS = (32.0, 1.0)


def scaled_betas(geometry: Geometry, trained: int) -> tuple[float, float]:
    """YaRN's beta_fast / beta_slow moved to another geometry so that they cut its pairs where 32 / 1 cut Llama 2's:
    a pair's rotations over L fall geometrically from the fastest pair (L / 2 pi) to the slowest, and each beta keeps
    its place on that log scale (32 sits 33% of the way from Llama 2's fastest pair to its slowest, 1 at 71%)."""

    def ends(g: Geometry, length: int) -> tuple[float, float]:
        rotations = length * g.default_inv_freq() / (2 * math.pi)  # (d/2,)
        return math.log(float(rotations[0])), math.log(float(rotations[-1]))

    ref_fast, ref_slow = ends(YARN_REFERENCE, YARN_REFERENCE.original_length)
    fast, slow = ends(geometry, trained)
    out = []
    for beta in YARN_DEFAULT_BETAS:
        share = (ref_fast - math.log(beta)) / (ref_fast - ref_slow)
        out.append(float(f"{math.exp(fast - share * (fast - slow)):.4g}"))
    return out[0], out[1]


def longrope_seeds(space: SearchSpace, geometry: Geometry) -> dict[str, tuple[float, ...]]:
    """Starting long factors, each clipped to the searched [1, 1 + s]: PI (s for every pair), NTK-aware (s^(2i/(d-2)),
    the per-pair scale of its base change) and YaRN's ramp with the paper's 32 / 1 (LongRoPE's own initial factors:
    s where YaRN interpolates, 1 where it extrapolates)."""
    s, d = space.factor, geometry.rotary_dim
    index = np.arange(d // 2, dtype=np.float64)
    trained = int(space.base.params.get("original_max_position_embeddings") or geometry.original_length)
    gamma = yarn_ramp(geometry, {"beta_fast": 32.0, "beta_slow": 1.0, "ramp": "index", "truncate": True}, trained)
    seeds = {"pi": np.full(d // 2, s), "ntk": s ** (2 * index / (d - 2)), "yarn": s * (1 - gamma) + gamma}
    return {name: monotone(list(np.clip(v, 1.0, 1.0 + s))) for name, v in seeds.items()}


def point_of(
    space: SearchSpace, geometry: Geometry, spec_params: dict[str, Any], attention: tuple[AttentionSpec, ...] = ()
) -> dict[str, Any]:
    """The point of the space that gives a method with these parameters (for seeding the search with a known method);
    {} when one of them lies outside the searched ranges."""
    point: dict[str, Any] = {}
    for dim in space.dims:
        if space.vector and dim.name.split(".")[0] in FACTOR_LISTS:
            name, index = dim.name.split(".")
            point[dim.key] = float(spec_params[name][int(index)])
            continue
        source = next((a.params for a in attention if a.name == dim.owner), {}) if dim.owner else spec_params
        value = source.get(dim.name)
        if dim.name == BETA_SLOW_RATIO:
            value = float(spec_params["beta_slow"]) / float(spec_params["beta_fast"])
        if value is None and dim.name == "attention_factor" and not dim.owner:  # the method's own default factor
            value = compute(space.base.name, geometry, {**spec_params, "attention_factor": None}).attention_factor
        if value is None and dim.name == "alpha":  # ntk at its default: alpha = the factor
            value = space.factor
        if value is None:
            return {}
        if not dim.low <= float(value) <= dim.high:
            return {}
        point[dim.key] = value
    return point


def describe(space: SearchSpace) -> str:
    """One line: what is searched, e.g. 'yarn(factor=8): beta_fast in [0.5, 128] log, ...'."""
    vector = [d for d in space.dims if space.vector and d.name.split(".")[0] in FACTOR_LISTS]
    parts = [f"{d.key} in [{d.low:g}, {d.high:g}]{' log' if d.log else ''}" for d in space.dims if d not in vector]
    for name in reversed(space.lists()):
        first = next(d for d in vector if d.name == f"{name}.0")
        parts.insert(
            0,
            f"{space.pairs} per-pair {name.split('_')[0]} factors in [{format_param(first.low)}, "
            f"{format_param(first.high)}]"
            f"{' log' if first.log else ''} on a 0.01 grid, non-decreasing",
        )
    return f"{space.base.label}: {', '.join(parts)}"
