"""RoPE context-extension methods as pure math: geometry + parameters -> inverse frequencies + attention factor.

No model, no config object, no torch module: every method is a function of the rotary geometry (rotary dim d,
base b, original trained length L) and its own parameters. Frequencies are float64 numpy arrays with one entry
per rotary pair i = 0 .. d/2-1, starting from the default RoPE frequencies theta_i = b^(-2i/d) (Su et al. 2021,
RoFormer eq. 15).

The attention factor is the multiplier applied to cos and sin, i.e. to q AND k, so attention logits scale by its
square (YaRN, Peng et al. 2023, section 3.4: sqrt(1/t) = 0.1 ln(s) + 1 multiplies both).

References:
  PI      Chen et al. 2023, "Extending Context Window of LLMs via Positional Interpolation", eq. 4.
  NTK     bloc97, "NTK-Aware Scaled RoPE" (2023); YaRN paper section 3.1, eq. 14-16: b' = b * s^(d/(d-2)).
  NTK-mixed Su, kexue.fm/archives/9706: theta_j / s^((j/(d/2))^b) for pair j = 1 .. d/2 (vLLM `ntk` + mixed_b).
  Dynamic emozilla, "Dynamically Scaled RoPE" (2023); YaRN paper section 3.3: s = max(1, l/L).
  YaRN    Peng, Quesnelle, Fan, Shippole 2023, "YaRN: Efficient Context Window Extension of LLMs",
          eq. 17-18 (ramp gamma(r) on r = L/lambda, blend h(theta) = (1-gamma) theta/s + gamma theta),
          eq. 22 (sqrt(1/t) = 0.1 ln s + 1); reference code github.com/jquesnelle/yarn (ramp over dim index).
  Llama 3 Meta 2024, "The Llama 3 Herd of Models"; transformers `_compute_llama3_parameters`.
  LongRoPE Ding et al. 2024, "LongRoPE: Extending LLM Context Window Beyond 2 Million Tokens": per-pair rescale
          factors lambda_i, theta'_i = theta_i / lambda_i, short factors up to L and long ones past it, attention
          factor sqrt(1 + ln s / ln L); transformers `_compute_longrope_parameters`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..errors import CtxevalError
from .params import Param, coerce_param


@dataclass(frozen=True)
class Geometry:
    """Rotary geometry of a model: rotary dim d (head_dim * partial_rotary_factor), base b, trained length L."""

    rotary_dim: int
    base: float
    original_length: int

    def __post_init__(self) -> None:
        if self.rotary_dim < 2 or self.rotary_dim % 2:
            raise CtxevalError(f"rotary dim must be an even number >= 2, got {self.rotary_dim}")
        if not (self.base > 1 and math.isfinite(self.base)):
            raise CtxevalError(f"RoPE base must be a finite number > 1, got {self.base}")
        if self.original_length < 1:
            raise CtxevalError(f"original length must be >= 1, got {self.original_length}")

    def default_inv_freq(self, base: float | None = None) -> np.ndarray:
        """theta_i = b^(-2i/d), i = 0 .. d/2-1, float64.  # (d/2,)"""
        b = self.base if base is None else base
        return 1.0 / b ** (np.arange(0, self.rotary_dim, 2, dtype=np.float64) / self.rotary_dim)


@dataclass(frozen=True)
class RopeFreqs:
    """What a method produces: per-pair inverse frequencies and the q/k attention factor."""

    inv_freq: np.ndarray  # (d/2,) float64
    attention_factor: float
    # scale a pair counts as "interpolated" at (s for PI/YaRN, the effective s for dynamic methods); for the plan
    interpolation_factor: float = 1.0


@dataclass(frozen=True)
class Method:
    name: str
    summary: str
    fn: Callable[[Geometry, dict[str, Any], int | None], RopeFreqs]
    params: tuple[Param, ...] = ()
    length_dependent: bool = False
    aliases: tuple[str, ...] = ()
    # paper names accepted for parameters, e.g. YaRN's alpha/beta
    param_aliases: dict[str, str] = field(default_factory=dict)
    transformers_rope_type: str | None = None  # the rope_type transformers uses for the same method, if any

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)

    @property
    def takes_factor(self) -> bool:
        return self.param("factor") is not None


# ---------------------------------------------------------------------------------------------------------------
# shared parameters

_FACTOR = Param("factor", float, 1.0, "scale s = extended length / original length", minimum=1.0)
START_TOKENS = "start_token_idx"  # LongRoPE's "mixed" embedding: positions < n keep plain RoPE (patching.py)
_ORIG = Param(
    "original_max_position_embeddings",
    int,
    None,
    "override the original trained length L (default: the model's)",
    positive=True,
)
_BETA_FAST = Param(
    "beta_fast", float, 32.0, "paper's beta: pairs with more than beta rotations over L are kept", positive=True
)
_BETA_SLOW = Param(
    "beta_slow",
    float,
    1.0,
    "paper's alpha: pairs with fewer than alpha rotations over L are interpolated",
    positive=True,
)
_RAMP = Param(
    "ramp",
    str,
    "index",
    "index: linear in the pair index (transformers, official code); ratio: linear in r=L/lambda (paper's gamma)",
    choices=("index", "ratio"),
)
_TRUNCATE = Param("truncate", bool, True, "ramp=index only: round the correction range outward (transformers default)")
_YARN_PARAM_ALIASES = {"alpha": "beta_slow", "beta": "beta_fast"}


def _length(geom: Geometry, params: dict[str, Any]) -> int:
    return params.get("original_max_position_embeddings") or geom.original_length


def _ntk_base(base: float, s: float, d: int) -> float:
    """NTK-aware base change b' = b * s^(d/(d-2)) (YaRN paper eq. 16)."""
    return base * s ** (d / (d - 2))


# ---------------------------------------------------------------------------------------------------------------
# methods


def _none(geom: Geometry, params: dict[str, Any], length: int | None) -> RopeFreqs:
    """Plain RoPE: theta_i = b^(-2i/d)."""
    return RopeFreqs(geom.default_inv_freq(), 1.0)


def _pi(geom: Geometry, params: dict[str, Any], length: int | None) -> RopeFreqs:
    """Position Interpolation (Chen et al. 2023, eq. 4): f'(x, m) = f(x, m/s), i.e. theta_i / s for every pair."""
    s = params["factor"]
    return RopeFreqs(geom.default_inv_freq() / s, 1.0, s)


def _ntk(geom: Geometry, params: dict[str, Any], length: int | None) -> RopeFreqs:
    """Static NTK-aware scaling (bloc97 2023; YaRN eq. 16): base b' = b * s^(d/(d-2)).

    `alpha` is the original post's name for the same scale; `base` sets b' directly.
    """
    d = geom.rotary_dim
    if params.get("base") is not None:
        new_base = params["base"]
    else:
        s = params["alpha"] if params.get("alpha") is not None else params["factor"]
        new_base = _ntk_base(geom.base, s, d)
    # effective s whose NTK base this is, so the plan can classify the lowest frequency as interpolated
    s_eff = (new_base / geom.base) ** ((d - 2) / d)
    return RopeFreqs(geom.default_inv_freq(new_base), 1.0, s_eff)


def _ntk_mixed(geom: Geometry, params: dict[str, Any], length: int | None) -> RopeFreqs:
    """NTK-mixed (Su, kexue.fm/archives/9706; vLLM NTKScalingRotaryEmbedding with mixed_b): pair j = 1 .. d/2 is
    divided by lambda_j = exp(a j^b), a = ln s / (d/2)^b, i.e. s^((j/(d/2))^b): the last pair by s (interpolated),
    the first by s^((2/d)^b). mixed_b = 1 is vLLM's plain `ntk` (base b*s, then / s^(2/d)), not ctxeval's `ntk`."""
    s, b, half = params["factor"], params["mixed_b"], geom.rotary_dim // 2
    exponents = (np.arange(1, half + 1, dtype=np.float64) / half) ** b
    return RopeFreqs(geom.default_inv_freq() / s**exponents, 1.0, s)


def _dynamic_ntk(geom: Geometry, params: dict[str, Any], length: int | None) -> RopeFreqs:
    """Dynamic NTK (emozilla 2023): NTK-aware base recomputed from the current sequence length l.

    rule=transformers: b' = b * (s*l'/L - (s-1))^(d/(d-2)) with l' = max(l, L) (transformers `dynamic`).
    rule=paper:        b' = b * s'^(d/(d-2)) with s' = max(1, l/L) (YaRN paper section 3.3); ignores factor.
    With factor=1 both rules coincide.
    """
    L = _length(geom, params)
    d = geom.rotary_dim
    current = L if length is None else length
    if params["rule"] == "paper":
        s_eff = max(1.0, current / L)
    else:
        s = params["factor"]
        s_eff = s * max(current, L) / L - (s - 1)
    return RopeFreqs(geom.default_inv_freq(_ntk_base(geom.base, s_eff, d)), 1.0, s_eff)


def _correction_dim(num_rotations: float, d: int, base: float, L: int) -> float:
    """Pair-index coordinate (in units of the rotary dim) whose wavelength fits `num_rotations` times into L.

    Solves L / lambda_j = num_rotations for j with lambda_j = 2 pi b^(j/d) (official YaRN code `find_correction_dim`).
    """
    return (d * math.log(L / (num_rotations * 2 * math.pi))) / (2 * math.log(base))


def yarn_ramp(geom: Geometry, params: dict[str, Any], L: int) -> np.ndarray:
    """gamma per pair: 1 = keep the frequency (extrapolate), 0 = divide it by s (interpolate).  # (d/2,)

    ramp=index (official code, transformers): linear in the index between the correction dims of beta_fast and
    beta_slow, optionally rounded outward (truncate). ramp=ratio (paper eq. 18): linear in r = L/lambda between
    alpha=beta_slow and beta=beta_fast.
    """
    d = geom.rotary_dim
    beta_fast, beta_slow = params["beta_fast"], params["beta_slow"]
    if params["ramp"] == "ratio":
        wavelength = 2 * math.pi / geom.default_inv_freq()
        r = L / wavelength
        return np.clip((r - beta_slow) / (beta_fast - beta_slow), 0.0, 1.0)
    low = _correction_dim(beta_fast, d, geom.base, L)
    high = _correction_dim(beta_slow, d, geom.base, L)
    if params["truncate"]:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001  # as the reference code: avoid dividing by zero
    index = np.arange(d // 2, dtype=np.float64)
    interpolate = np.clip((index - low) / (high - low), 0.0, 1.0)
    return 1.0 - interpolate


def _yarn_attention_factor(s: float, params: dict[str, Any]) -> float:
    """sqrt(1/t) = 0.1 ln(s) + 1 (YaRN eq. 22), or DeepSeek's mscale(s, mscale)/mscale(s, mscale_all_dim)."""

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])
    if params.get("mscale") and params.get("mscale_all_dim"):
        return mscale(s, params["mscale"]) / mscale(s, params["mscale_all_dim"])
    return mscale(s)


def _by_parts(geom: Geometry, params: dict[str, Any], s: float, L: int) -> np.ndarray:
    """NTK-by-parts blend of frequencies (YaRN eq. 18): h(theta) = (1 - gamma) theta / s + gamma theta."""
    theta = geom.default_inv_freq()
    gamma = yarn_ramp(geom, params, L)
    return (1.0 - gamma) * theta / s + gamma * theta


def _ntk_by_parts(geom: Geometry, params: dict[str, Any], length: int | None) -> RopeFreqs:
    """NTK-by-parts (YaRN section 3.2): YaRN's frequency blend without the attention temperature."""
    s = params["factor"]
    return RopeFreqs(_by_parts(geom, params, s, _length(geom, params)), 1.0, s)


def _yarn(geom: Geometry, params: dict[str, Any], length: int | None) -> RopeFreqs:
    """YaRN (section 3.4): NTK-by-parts frequencies + attention factor 0.1 ln(s) + 1 on q and k."""
    s = params["factor"]
    inv = _by_parts(geom, params, s, _length(geom, params))
    return RopeFreqs(inv, _yarn_attention_factor(s, params), s)


def _dynamic_yarn(geom: Geometry, params: dict[str, Any], length: int | None) -> RopeFreqs:
    """Dynamic YaRN (YaRN section 3.3 + 3.4): YaRN with s = max(1, l/L) for the current length l; with
    finetuned_factor f, s = max(f, l/L): the YaRN repo's `finetuned` mode for a checkpoint fine-tuned with YaRN at
    scale f (modeling_llama_together_yarn.py, FlashYaRNRotaryEmbedding: s = f up to f L, l/L past it)."""
    L = _length(geom, params)
    s = max(params["finetuned_factor"], (L if length is None else length) / L)
    inv = _by_parts(geom, params, s, L)
    return RopeFreqs(inv, _yarn_attention_factor(s, params), s)


def _llama3(geom: Geometry, params: dict[str, Any], length: int | None) -> RopeFreqs:
    """Llama 3.1 scaling: keep wavelengths < L/high_freq_factor, divide those > L/low_freq_factor by s, and blend
    in between with smooth = (L/lambda - low) / (high - low) (transformers `_compute_llama3_parameters`)."""
    s, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
    L = _length(geom, params)
    theta = geom.default_inv_freq()
    wavelength = 2 * math.pi / theta
    smooth = (L / wavelength - low) / (high - low)
    blended = (1 - smooth) * theta / s + smooth * theta
    inv = np.where(wavelength < L / high, theta, np.where(wavelength > L / low, theta / s, blended))
    return RopeFreqs(inv, 1.0, s)


def _longrope(geom: Geometry, params: dict[str, Any], length: int | None) -> RopeFreqs:
    """LongRoPE (Ding et al. 2024): theta'_i = theta_i / lambda_i with the short factors for sequences up to L and the
    long ones past it; attention factor sqrt(1 + ln s / ln L) for s > 1 (transformers `longrope`)."""
    L = _length(geom, params)
    pairs = geom.rotary_dim // 2
    for name in ("short_factor", "long_factor"):
        if params.get(name) is None:
            raise CtxevalError(
                f"longrope needs {name}: {pairs} per-pair factors, e.g. {name}=@factors.json (a JSON or "
                f"TOML file, or a checkpoint's config.json) or {name}=1.0;1.1;..."
            )
        if len(params[name]) != pairs:
            raise CtxevalError(
                f"longrope: {name} has {len(params[name])} values; this model's rotary dim "
                f"{geom.rotary_dim} needs {pairs} (one per rotary pair)"
            )
    if int(params.get(START_TOKENS) or 0) >= L:
        raise CtxevalError(
            f"longrope: {START_TOKENS}={params[START_TOKENS]} keeps plain RoPE on more positions than the trained "
            f"length {L:,}; give fewer start tokens (LongRoPE keeps a handful, e.g. {START_TOKENS}=4)"
        )
    long = length is not None and length > L
    factors = np.asarray(params["long_factor" if long else "short_factor"], dtype=np.float64)
    s = params["factor"]
    if params.get("attention_factor") is not None:
        attention = float(params["attention_factor"])
    else:
        attention = 1.0 if s <= 1 else math.sqrt(1 + math.log(s) / math.log(L))
    return RopeFreqs(geom.default_inv_freq() / factors, attention, float(np.max(factors)))


def _native(geom: Geometry, params: dict[str, Any], length: int | None) -> RopeFreqs:
    raise CtxevalError(
        "native is the checkpoint's own RoPE as shipped (e.g. Llama 3.1's llama3 scaling): it has no "
        "formula here; ctxeval reads it back from the model instead"
    )


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method(
            "none", "plain RoPE at the original base, no extension (replaces a scaling the checkpoint ships)", _none
        ),
        Method("native", "the checkpoint's own RoPE as shipped, untouched (read back and recorded)", _native),
        Method(
            "pi",
            "Position Interpolation: every frequency divided by s",
            _pi,
            (_FACTOR,),
            aliases=("linear",),
            transformers_rope_type="linear",
        ),
        Method(
            "ntk",
            "static NTK-aware: base b*s^(d/(d-2))",
            _ntk,
            (
                _FACTOR,
                Param("alpha", float, None, "the NTK post's scale, same role as factor", minimum=1.0),
                Param("base", float, None, "set the new base directly", positive=True),
            ),
        ),
        Method(
            "ntk-mixed",
            "NTK-mixed (Su): pair j divided by s^((j/(d/2))^mixed_b); vLLM's ntk (mixed_b=1: its plain ntk)",
            _ntk_mixed,
            (
                _FACTOR,
                Param("mixed_b", float, 1.0, "exponent b of lambda_j = exp(a j^b) (vLLM's mixed_b)", minimum=0.0),
            ),
        ),
        Method(
            "dynamic-ntk",
            "NTK-aware base recomputed from each sequence's length",
            _dynamic_ntk,
            (
                _FACTOR,
                _ORIG,
                Param(
                    "rule",
                    str,
                    "transformers",
                    "transformers: b*(s*l/L-(s-1))^(d/(d-2)); paper: s=max(1,l/L)",
                    choices=("transformers", "paper"),
                ),
            ),
            length_dependent=True,
            transformers_rope_type="dynamic",
        ),
        Method(
            "ntk-by-parts",
            "YaRN's frequency blend without the attention temperature",
            _ntk_by_parts,
            (_FACTOR, _ORIG, _BETA_FAST, _BETA_SLOW, _RAMP, _TRUNCATE),
            param_aliases=_YARN_PARAM_ALIASES,
        ),
        Method(
            "yarn",
            "NTK-by-parts + attention factor 0.1 ln(s)+1 on q and k",
            _yarn,
            (
                _FACTOR,
                _ORIG,
                _BETA_FAST,
                _BETA_SLOW,
                _RAMP,
                _TRUNCATE,
                Param(
                    "attention_factor", float, None, "override the q/k multiplier (default 0.1 ln s + 1)", positive=True
                ),
                Param(
                    "mscale",
                    float,
                    None,
                    "DeepSeek: attention factor mscale(s,mscale)/mscale(s,mscale_all_dim)",
                    minimum=0.0,
                ),
                Param("mscale_all_dim", float, None, "DeepSeek: see mscale", minimum=0.0),
            ),
            param_aliases=_YARN_PARAM_ALIASES,
            transformers_rope_type="yarn",
        ),
        Method(
            "dynamic-yarn",
            "YaRN with s = max(1, l/L) recomputed from each sequence's length (the paper's rule: plain "
            "RoPE up to L; the YaRN repo's patch differs, docs/protocols.md)",
            _dynamic_yarn,
            (
                _ORIG,
                _BETA_FAST,
                _BETA_SLOW,
                _RAMP,
                _TRUNCATE,
                Param(
                    "finetuned_factor",
                    float,
                    1.0,
                    "s = max(this, l/L): the YaRN repo's finetuned mode for a "
                    "checkpoint fine-tuned with YaRN at this scale (1: the paper's rule)",
                    minimum=1.0,
                ),
                Param(
                    "attention_factor",
                    float,
                    None,
                    "replace the q/k multiplier 0.1 ln s + 1 by this constant (the "
                    "YaRN repo's attn_factor multiplies it instead)",
                    positive=True,
                ),
            ),
            length_dependent=True,
            param_aliases=_YARN_PARAM_ALIASES,
        ),
        Method(
            "llama3",
            "Llama 3.1: keep high, divide low frequencies by s, blend between",
            _llama3,
            (
                Param("factor", float, 8.0, "scale s", minimum=1.0),
                _ORIG,
                Param("low_freq_factor", float, 1.0, "wavelengths > L/low_freq_factor are divided by s", positive=True),
                Param("high_freq_factor", float, 4.0, "wavelengths < L/high_freq_factor are kept", positive=True),
            ),
            transformers_rope_type="llama3",
        ),
        Method(
            "longrope",
            "LongRoPE: per-pair factors, short up to L and long past it, attention sqrt(1+ln s/ln L)",
            _longrope,
            (
                Param(
                    "short_factor",
                    tuple,
                    None,
                    "d/2 factors for lengths <= L: @FILE (JSON/TOML, or a checkpoint's config.json) or 1.0;1.1;...",
                ),
                Param("long_factor", tuple, None, "d/2 factors for lengths > L: as short_factor"),
                Param("factor", float, 1.0, "s = extended / original length, for the attention factor", minimum=1.0),
                _ORIG,
                Param(
                    "attention_factor",
                    float,
                    None,
                    "override the q/k multiplier (default sqrt(1 + ln s / ln L))",
                    positive=True,
                ),
                Param(START_TOKENS, int, 0, "positions < n keep plain RoPE (LongRoPE's mixed embedding)", minimum=0),
            ),
            length_dependent=True,
            transformers_rope_type="longrope",
        ),
    )
}
_ALIASES = {alias: m.name for m in METHODS.values() for alias in m.aliases}


def get_method(name: str) -> Method:
    key = _ALIASES.get(name, name)
    if key not in METHODS:
        names = ", ".join(list(METHODS) + list(_ALIASES))
        raise CtxevalError(f"unknown method '{name}'; choose one of: {names} (see 'ctxeval methods')")
    return METHODS[key]


def resolve_params(method: Method, given: dict[str, Any]) -> dict[str, Any]:
    """Validate user parameters and fill defaults. Unknown or invalid parameters raise CtxevalError."""
    params: dict[str, Any] = {}
    given_as: dict[str, str] = {}  # parameter -> the name the user gave it under (itself or a paper alias)
    for raw_key, value in given.items():
        key = method.param_aliases.get(raw_key, raw_key)
        p = method.param(key)
        if p is None:
            valid = ", ".join(p.name for p in method.params) or "no parameters"
            extra = (
                f" (aliases: {', '.join(f'{a}={b}' for a, b in method.param_aliases.items())})"
                if method.param_aliases
                else ""
            )
            raise CtxevalError(f"method '{method.name}' does not take '{raw_key}'; it takes: {valid}{extra}")
        if key in params:
            raise CtxevalError(f"{method.name}: '{key}' given twice (as '{given_as[key]}' and '{raw_key}'); keep one")
        given_as[key] = raw_key
        params[key] = None if value is None else coerce_param(method.name, p, value)
    if "truncate" in params and params.get("ramp") == "ratio":
        raise CtxevalError(f"{method.name}: truncate applies only to ramp=index; drop it or use ramp=index")
    for p in method.params:
        params.setdefault(p.name, p.default)
    _check_combination(method, params)
    return params


def _check_combination(method: Method, params: dict[str, Any]) -> None:
    """Constraints between parameters, checked before any model work starts."""
    if "beta_fast" in params and params["beta_slow"] >= params["beta_fast"]:
        raise CtxevalError(
            f"{method.name}: beta_slow (alpha) must be smaller than beta_fast (beta), got beta_slow="
            f"{params['beta_slow']:g} beta_fast={params['beta_fast']:g}; the paper uses alpha=1, beta=32"
        )
    if "low_freq_factor" in params and params["low_freq_factor"] >= params["high_freq_factor"]:
        raise CtxevalError(
            f"{method.name}: low_freq_factor must be smaller than high_freq_factor, got "
            f"{params['low_freq_factor']:g} >= {params['high_freq_factor']:g}"
        )
    if method.name == "dynamic-ntk" and params["rule"] == "paper" and params["factor"] != 1.0:
        raise CtxevalError(
            "dynamic-ntk: rule=paper uses s = max(1, l/L) and takes no factor; drop factor or use rule=transformers"
        )
    if method.name == "ntk":
        given = [k for k in ("alpha", "base") if params.get(k) is not None]
        if given and params["factor"] != 1.0:
            raise CtxevalError(f"ntk: give either factor or {given[0]}, not both")
        if len(given) > 1:
            raise CtxevalError("ntk: give either alpha or base, not both")


def compute(
    method: str | Method, geom: Geometry, params: dict[str, Any] | None = None, length: int | None = None
) -> RopeFreqs:
    """Frequencies and attention factor of `method` for `geom`; `length` is the sequence length (dynamic methods)."""
    m = get_method(method) if isinstance(method, str) else method
    full = resolve_params(m, params or {})
    if length is not None and length < 1:
        raise CtxevalError(f"sequence length must be >= 1, got {length}")
    try:
        with np.errstate(all="ignore"):  # an overflow shows as a non-finite frequency, checked below
            freqs = m.fn(geom, full, length)
    except (ValueError, OverflowError, ZeroDivisionError) as exc:  # e.g. log(0) from beta_fast=1e308
        raise CtxevalError(
            f"{m.name} with {params} cannot be computed for {geom} ({exc}); use parameter values "
            "of the size the method's papers use"
        ) from None
    if not np.all(np.isfinite(freqs.inv_freq)) or not np.all(freqs.inv_freq > 0):
        raise CtxevalError(f"{m.name} with {params} gives non-finite or non-positive frequencies for {geom}")
    if not (math.isfinite(freqs.attention_factor) and freqs.attention_factor > 0):
        raise CtxevalError(
            f"{m.name} with {params} gives the attention factor {freqs.attention_factor} for {geom}; "
            "use parameter values of the size the method's papers use"
        )
    return freqs


# ---------------------------------------------------------------------------------------------------------------
# per-pair plan (what `ctxeval plan` shows)


@dataclass(frozen=True)
class PairPlan:
    pair: int
    wavelength: float  # original wavelength 2 pi / theta_i, in tokens
    ratio: float  # r = L / wavelength: rotations over the original length
    inv_freq: float  # the method's inverse frequency
    scale: float  # theta_i / theta'_i: 1 = unchanged, s = fully interpolated
    group: str  # extrapolated | blended | interpolated


def plan(
    method: str | Method, geom: Geometry, params: dict[str, Any] | None = None, length: int | None = None
) -> tuple[RopeFreqs, list[PairPlan]]:
    """Per-pair view of a method: how much each pair's frequency is scaled and which regime it falls in."""
    m = get_method(method) if isinstance(method, str) else method
    freqs = compute(m, geom, params, length)
    full = resolve_params(m, params or {})
    L = _length(geom, full)
    theta = geom.default_inv_freq()
    scale = theta / freqs.inv_freq
    s = freqs.interpolation_factor
    rows = []
    for i, (t, inv, sc) in enumerate(zip(theta, freqs.inv_freq, scale)):
        if math.isclose(sc, 1.0, rel_tol=1e-9):
            group = "extrapolated"
        elif s > 1 and math.isclose(sc, s, rel_tol=1e-9):
            group = "interpolated"
        else:
            group = "blended"
        wavelength = 2 * math.pi / t
        rows.append(PairPlan(i, wavelength, L / wavelength, float(inv), float(sc), group))
    return freqs, rows
