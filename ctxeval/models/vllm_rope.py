"""A RoPE method as vLLM applies it: the `hf_overrides` that make vLLM build the method's rotary table, the cases where
vLLM's rule cannot equal ctxeval's (refused before anything loads), and the check of the table vLLM really built
against methods.py. Pure: no vLLM import (models.vllm_engine loads the engine and probes its rotary modules).

What vLLM 0.32 does with each rope_type (vllm/model_executor/layers/rotary_embedding/), and what follows here:
- default / linear / llama3: a cos/sin table of `max_position_embeddings` rows; ctxeval's static NTK is plain RoPE at
  the new base (rope_config.rope_parameters). max_position_embeddings is raised to the longest length if needed.
- yarn: a table of original_max_position_embeddings x factor rows, whatever max_position_embeddings says: lengths past
  L x s cannot run on vLLM (refused here; transformers extrapolates past it, vLLM has no rows).
- ntk (factor, mixed_b): NTK-mixed (ntk_scaling_rope.py): pair j = 1 .. d/2 divided by exp(a j^b), a = ln s / (d/2)^b;
  without mixed_b, base b*s and every pair / s^(2/d), which is mixed_b = 1. That is ctxeval's `ntk-mixed`, NOT ctxeval's
  `ntk` (base b*s^(d/(d-2)), the YaRN repo's; 4.4% apart at d = 64, s = 4): ctxeval's `ntk` goes to vLLM as plain RoPE at
  its new base, `ntk-mixed` as vLLM's ntk with mixed_b always given, and only once vllm_ntk_inv_freq (vLLM's rule from
  the entry) equals ctxeval's table.
- dynamic (factor): ONE base for the whole engine, b * (s * M / T - (s - 1))^(d/(d-2)) with M =
  max_position_embeddings and T = max_trained_positions; that is ctxeval's (transformers') per-length rule at exactly
  the length M. So dynamic-ntk runs when every measured sequence has one length M > L (M is then set to it).
- longrope: short factors for every token when max_model_len <= original length, long factors for every token
  otherwise (fixed per engine); ctxeval picks by each sequence's length. Equal when all lengths lie on one side of L.
  Its attention factor is computed from max_position_embeddings / original: ctxeval's is passed as short_mscale and
  long_mscale instead.
- attention methods (Self-Extend, ReRoPE, log-n) and --attention-temperature change vLLM's attention kernels, which
  ctxeval does not patch: refused.

Every refusal here is decided from ctxeval's own math and the model's config.json: `check_plans` makes them before vLLM
is imported (models.vllm_engine.preflight reads the config), and `plan` makes them again once the engine's settings
are final.

The read-back (`compare_rotation`) takes what vLLM's own rotary forward did to a unit vector at every position the run
uses and decodes angle and magnitude per pair: the angle must equal position x inv_freq to READBACK_RTOL (relative)
plus the rounding of the table's dtype, the magnitude the attention factor likewise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np

from ..errors import CtxevalError
from ..rope.geometry import RopeInfo, require_trained_length, rope_info_from_config
from ..rope.methods import Geometry, RopeFreqs, compute
from ..specs import MethodSpec, with_default_factors
from .rope_config import rope_parameters

READBACK_RTOL = 1e-5  # as patching.READBACK_RTOL: the hf path's tolerance on inv_freq and the attention factor
# spacing of 1.0 in each dtype a rotary table can be stored in: a cos or sin value is rounded by half of it at most
DTYPE_EPS = {"float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7, "float64": 2.0**-52}
USE = "--backend vllm"
# the methods vLLM has a rope_type for (rope_config.rope_parameters; dynamic-ntk: _dynamic_entry)
VLLM_FORMS = ("none", "native", "ntk", "ntk-mixed", "pi", "yarn", "llama3", "longrope", "dynamic-ntk")


@dataclass(frozen=True)
class VllmRope:
    """How one method runs on vLLM: the overrides, the engine's max_model_len, and what the table must hold."""

    spec: MethodSpec
    hf_overrides: dict[str, Any]  # empty for `native`
    max_model_len: int
    lengths: tuple[int, ...]  # the measured lengths: the read-back checks positions 0..length-1 for each
    expected: dict[int, RopeFreqs] = field(default_factory=dict)  # length -> ctxeval's RoPE there ({} for native)

    def record(self) -> dict[str, Any]:
        return {"hf_overrides": self.hf_overrides, "max_model_len": self.max_model_len}


def plan(
    spec: MethodSpec,
    geometry: Geometry | None,
    lengths: tuple[int, ...],
    max_model_len: int,
    shipped_max_positions: int | None,
    partial_rotary_factor: float | None = None,
    fixed_lengths: bool = True,
) -> VllmRope:
    """The vLLM form of `spec` at `lengths` (every sequence at most `max_model_len` tokens), or a CtxevalError saying
    why vLLM cannot apply it as ctxeval does. `fixed_lengths`: every sequence of a length is exactly that long
    (needle, RULER); the yarn passkey's prompts are not."""
    check_method(spec, fixed_lengths)
    if spec.name == "native" or (spec.name == "none" and geometry is None):  # nothing to override or compare
        return VllmRope(spec, {}, max_model_len, tuple(lengths))
    if geometry is None:
        raise CtxevalError(f"{spec.label}: this model has no RoPE; use --method none or native")
    method, params = spec.method, spec.resolved
    original = int(params.get("original_max_position_embeddings") or geometry.original_length)
    positions = max(max_model_len, shipped_max_positions or 0)
    if spec.name == "dynamic-ntk":
        entry = _dynamic_entry(spec, geometry, params, lengths, max_model_len, original)
        positions = max_model_len
    elif spec.name == "ntk-mixed":
        entry = {
            "rope_type": "ntk",
            "factor": params["factor"],
            "mixed_b": params["mixed_b"],
            "rope_theta": geometry.base,
        }
    else:
        entry = rope_parameters(spec, geometry, max(lengths), use=USE)
        entry = dict(entry)
        if entry["rope_type"] == "yarn" and max_model_len > original * params["factor"]:
            raise CtxevalError(
                f"{spec.label}: vLLM's YaRN table holds original length x factor = {int(original * params['factor']):,} "
                f"positions and this run needs {max_model_len:,} (transformers extrapolates past them); use factor >= "
                f"{math.ceil(round(max_model_len / original * 100, 9)) / 100:g}, or --backend hf"
            )
        if entry["rope_type"] == "longrope":
            below = [L for L in lengths if L <= original]
            if below and len(below) < len(lengths):
                raise CtxevalError(
                    f"{spec.label}: vLLM uses LongRoPE's long factors for every token once max_model_len exceeds the "
                    f"original {original:,} tokens, ctxeval only for sequences longer than that; measure lengths "
                    f"<= {original:,} and longer ones in separate runs, or use --backend hf"
                )
            if below and max_model_len > original:  # vLLM would use the long factors for every token
                raise CtxevalError(
                    f"{spec.label}: this run's sequences reach {max_model_len:,} tokens (--max-model-len, or the "
                    f"passkey's reply after its prompt), past the original {original:,}, where vLLM switches every "
                    f"token to LongRoPE's long factors; keep lengths plus reply and --max-model-len within "
                    f"{original:,} tokens, or use --backend hf"
                )
            mscale = float(compute(method, geometry, spec.params, max(lengths)).attention_factor)
            entry = {k: v for k, v in entry.items() if k != "attention_factor"}
            entry.update(short_mscale=mscale, long_mscale=mscale)
    if partial_rotary_factor is not None:
        entry["partial_rotary_factor"] = partial_rotary_factor
    expected = {L: compute(method, geometry, spec.params, L) for L in sorted(set(lengths))}
    if entry["rope_type"] == "ntk":  # vLLM's ntk is NTK-mixed: sent only where its table is ctxeval's
        check_ntk_entry(spec, entry, geometry, expected[max(expected)])
    return VllmRope(
        spec,
        {"rope_parameters": entry, "max_position_embeddings": int(positions)},
        max_model_len,
        tuple(sorted(set(lengths))),
        expected,
    )


def vllm_ntk_inv_freq(entry: dict[str, Any], rotary_dim: int) -> np.ndarray:
    """The inverse frequencies vLLM 0.32's NTKScalingRotaryEmbedding computes from a `rope_type: ntk` entry (float64
    here; vLLM's float32 differs by < 1e-6 relative)."""
    base, s, b = float(entry["rope_theta"]), float(entry["factor"]), entry.get("mixed_b")
    half = rotary_dim // 2
    index = np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim
    if b is None:  # base b*s, then every pair / s^(2/d)
        return 1.0 / (base * s) ** index / s ** (2 / rotary_dim)
    a = math.log(s) / half ** float(b)
    return 1.0 / base**index / np.exp(a * np.arange(1, half + 1, dtype=np.float64) ** float(b))


def check_ntk_entry(spec: MethodSpec, entry: dict[str, Any], geometry: Geometry, expected: RopeFreqs) -> None:
    """Refuse a `rope_type: ntk` entry whose vLLM table is not ctxeval's (CtxevalError naming both)."""
    table = vllm_ntk_inv_freq(entry, geometry.rotary_dim)
    diff = float(np.max(np.abs(table - expected.inv_freq) / expected.inv_freq))
    if not diff <= READBACK_RTOL or expected.attention_factor != 1.0:
        raise CtxevalError(
            f"{spec.label}: vLLM's ntk (NTK-mixed) computes other frequencies than ctxeval's {spec.name} (up to "
            f"{diff:.1%} apart); use --backend hf"
        )


def check_attention(spec: MethodSpec) -> None:
    """Refuse, in one line, a spec that changes the attention itself (attention methods, temperature)."""
    if spec.attention or spec.temperature != 1.0:
        raise CtxevalError(
            f"{spec.label} changes the attention itself; vLLM runs its own attention kernels, which "
            "ctxeval does not patch: use --backend hf"
        )


def check_method(spec: MethodSpec, fixed_lengths: bool = True) -> None:
    """Refuse, in one line, what vLLM cannot apply as ctxeval does whatever the model and lengths: the attention
    changes (check_attention), methods without a vLLM rope_type, YaRN's ratio ramp, dynamic-ntk's paper rule or
    prompts of several lengths under one dynamic base."""
    check_attention(spec)
    params = spec.resolved
    if spec.name not in VLLM_FORMS:
        raise CtxevalError(
            f"{spec.label}: vLLM has no rope_type that computes {spec.name} as ctxeval does; use yarn, ntk, "
            "ntk-mixed, pi, llama3, longrope or dynamic-ntk, or --backend hf"
        )
    if spec.name == "yarn" and params["ramp"] != "index":
        raise CtxevalError(
            f"{spec.label}: vLLM's YaRN ramps over the rotary index (the official code), not over the paper's ratio "
            "gamma(r); use ramp=index, or --backend hf"
        )
    if spec.name == "dynamic-ntk" and params["rule"] != "transformers":
        raise CtxevalError(f"{spec.label} on vLLM: only rule=transformers has a vLLM form; use it, or --backend hf")
    if spec.name == "dynamic-ntk" and not fixed_lengths:
        raise CtxevalError(
            f"{spec.label} on vLLM: this protocol's sequences differ in length and vLLM fixes one base per engine; "
            "use --backend hf"
        )


def plan_for_config(
    spec: MethodSpec,
    rope: RopeInfo,
    config: Any,
    lengths: tuple[int, ...],
    max_model_len: int,
    fixed_lengths: bool = True,
) -> VllmRope:
    """`plan` with the geometry, the shipped max_position_embeddings and partial rotary factor of a transformers
    config (`rope`: its rope_info_from_config): what the engine runs (VllmModel.plan) and what check_plans decides
    before vLLM is imported, from the same arguments."""
    shipped = rope.shipped or {}
    partial_rotary = shipped.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None))
    return plan(
        spec,
        rope.geometry,
        tuple(lengths),
        max_model_len,
        getattr(config, "max_position_embeddings", None),
        None if partial_rotary in (None, 1.0) else float(partial_rotary),
        fixed_lengths,
    )


def check_plans(
    specs: list[MethodSpec],
    config: Any,
    lengths: list[int] | None,
    *,
    extra_tokens: int = 0,
    max_model_len: int | None = None,
    fixed_lengths: bool = True,
    exact: bool = True,
) -> None:
    """Every refusal of `plan` that a run would meet once its lengths are known, decided from a transformers config
    before vLLM is imported (CtxevalError in one line; nothing else happens). `lengths`: the run's lengths (None:
    unknown, so only check_method); `extra_tokens`: how far past its length a sequence reaches (the yarn passkey's
    reply); `max_model_len`: --max-model-len; `exact`: False when the run may still leave out its shortest lengths
    (default lengths shorter than the prompt, cli/needle.py), so a refusal is made only when every such run would
    meet it, and the rest is left to the check after vLLM loads. Factors left open are settled as the run settles
    them (specs.with_default_factors at the longest length)."""
    for spec in specs:
        check_method(spec, fixed_lengths)
    if not lengths:
        return
    rope = rope_info_from_config(config)
    specs, _ = with_default_factors(specs, max(lengths), rope.geometry)
    longest = max(lengths) + extra_tokens
    if max_model_len is not None and max_model_len < longest:
        raise CtxevalError(
            f"--max-model-len {max_model_len} is shorter than the run's longest sequence ({longest} tokens); raise it "
            "or drop it"
        )
    model_len = max_model_len or longest
    ordered = sorted(set(lengths))
    runs = [ordered] if exact else [ordered[i:] for i in range(len(ordered))]  # what the run may still keep
    for spec in specs:
        first = None
        for kept in runs:
            try:
                plan_for_config(spec, rope, config, tuple(kept), model_len, fixed_lengths)
            except CtxevalError as exc:
                first = first or exc
            else:
                first = None
                break
        if first is not None:
            raise first


def config_from_json(data: Any, specs: list[MethodSpec]) -> Any:
    """A model's config.json (parsed) as the config check_plans reads, when it names every field a refusal depends on,
    so that transformers' config class would fill in nothing that changes one; None otherwise (then transformers reads
    it: its import alone takes 3-14 s). Named: model_type, max_position_embeddings, the base, num_attention_heads and
    head_dim or hidden_size, in a causal LM's flat config (no remote code, no text_config, one RoPE for all layers).
    The rotary dim may come from a class default (head_dim, partial_rotary_factor): only LongRoPE's factor lists depend
    on it, so a longrope spec without both lists of this config's pair count is left to transformers."""
    if not isinstance(data, dict) or "auto_map" in data or "text_config" in data:
        return None
    architectures = data.get("architectures")
    if not isinstance(architectures, list) or not architectures:
        return None
    if not all(str(a).endswith("ForCausalLM") for a in architectures):
        return None
    params = data.get("rope_parameters") or data.get("rope_scaling") or {}
    if not isinstance(params, dict) or any(isinstance(v, dict) for v in params.values()):
        return None
    named = ("model_type", "max_position_embeddings", "num_attention_heads")
    base = params.get("rope_theta") or data.get("rope_theta") or data.get("rotary_emb_base")
    if not all(data.get(k) for k in named) or not (data.get("head_dim") or data.get("hidden_size")) or not base:
        return None
    config = SimpleNamespace(**data)
    try:
        geometry = rope_info_from_config(config).geometry
    except CtxevalError:
        return None  # transformers' reader says what is wrong with it
    for spec in specs:
        lists = [spec.params.get(k) for k in ("short_factor", "long_factor") if spec.params.get(k) is not None]
        pairs = geometry.rotary_dim // 2 if geometry is not None else None
        if spec.name == "longrope" and (len(lists) < 2 or any(len(f) != pairs for f in lists)):
            return None
    return config


def default_lengths(config: Any, name: str, multiples: tuple[float, ...]) -> list[int]:
    """The lengths a run without --lengths measures: `multiples` of the config's trained length (the rule of
    cli/run.py's default_lengths, for the config alone)."""
    length = require_trained_length(config, name)
    return sorted({max(2, int(length * m)) for m in multiples})


def _dynamic_entry(
    spec: MethodSpec,
    geometry: Geometry,
    params: dict[str, Any],
    lengths: tuple[int, ...],
    max_model_len: int,
    original: int,
) -> dict[str, Any]:
    why = None
    if len(set(lengths)) != 1:
        why = "vLLM computes one base per engine, at max_position_embeddings; give one --lengths value per run"
    elif max_model_len != lengths[0]:
        why = f"its base is fixed at max_model_len; drop --max-model-len (or make it the length, {lengths[0]})"
    elif lengths[0] <= original:
        why = (
            f"at {lengths[0]:,} <= the original {original:,} tokens ctxeval uses plain RoPE and vLLM does not; "
            f"measure a length above {original:,}"
        )
    if why:
        raise CtxevalError(f"{spec.label} on vLLM: {why}, or use --backend hf")
    return {
        "rope_type": "dynamic",
        "factor": params["factor"],
        "max_trained_positions": original,
        "rope_theta": geometry.base,
    }


def rotation_probe(rotary_dim: int, head_size: int, positions: int, neox: bool) -> np.ndarray:
    """The vector a probe rotates at each position: 1 in the first element of every rotary pair, 0 elsewhere
    (positions, head_size). After RoPE the pair holds (a cos(p w), a sin(p w))."""
    probe = np.zeros((positions, head_size), dtype=np.float32)
    half = rotary_dim // 2
    if neox:
        probe[:, :half] = 1.0  # pair i = (x[i], x[i + d/2])
    else:
        probe[:, 0:rotary_dim:2] = 1.0  # pair i = (x[2i], x[2i + 1])
    return probe


def decode_rotation(rotated: np.ndarray, rotary_dim: int, neox: bool) -> tuple[np.ndarray, np.ndarray]:
    """(angle, magnitude) per position and pair, each (positions, rotary_dim / 2), from a rotated probe."""
    rotated = np.asarray(rotated, dtype=np.float64)
    half = rotary_dim // 2
    if neox:
        cos, sin = rotated[:, :half], rotated[:, half:rotary_dim]
    else:
        cos, sin = rotated[:, 0:rotary_dim:2], rotated[:, 1:rotary_dim:2]
    return np.arctan2(sin, cos), np.hypot(cos, sin)


def compare_rotation(
    rotated: np.ndarray, expected: RopeFreqs, length: int, rotary_dim: int, neox: bool, dtype: str
) -> dict[str, Any]:
    """Compare the rotated probe at positions 0..length-1 with `expected`. The angle may differ from p x inv_freq by
    READBACK_RTOL of itself plus 2 eps of the table's dtype; the magnitude from the attention factor by READBACK_RTOL
    plus 2 eps (relative). Returns the worst excess over the tolerance (<= 0: passed) and where it was."""
    if rotated.shape[0] < length:
        raise CtxevalError(f"vLLM's rotary table covers {rotated.shape[0]:,} positions; length {length:,} needs more")
    angle, magnitude = decode_rotation(rotated[:length], rotary_dim, neox)
    eps = DTYPE_EPS.get(dtype, DTYPE_EPS["bfloat16"])
    inv = np.asarray(expected.inv_freq, dtype=np.float64)  # (d/2,)
    want = np.arange(length, dtype=np.float64)[:, None] * inv[None, :]  # (length, d/2)
    diff = np.abs(np.mod(angle - want + math.pi, 2 * math.pi) - math.pi)
    angle_excess = diff - (READBACK_RTOL * want + 2 * eps)
    factor = float(expected.attention_factor)
    mag_excess = np.abs(magnitude - factor) / factor - (READBACK_RTOL + 2 * eps)
    worst_angle = np.unravel_index(int(np.argmax(angle_excess)), angle_excess.shape)
    return {
        "length": length,
        "positions_checked": length,
        "max_angle_diff": float(diff.max()),
        "max_magnitude_rel_diff": float((np.abs(magnitude - factor) / factor).max()),
        "worst_excess": float(max(angle_excess.max(), mag_excess.max())),
        "worst_position": int(worst_angle[0]),
        "worst_pair": int(worst_angle[1]),
        "table_dtype": dtype,
        "inv_freq_readback": (angle[1] if length > 1 else angle[0]).tolist(),  # position 1: p x w = w, since w <= 1
        "attention_factor_readback": float(magnitude[0].mean()),
        "passed": bool(max(angle_excess.max(), mag_excess.max()) <= 0),
    }


def verify(rope: VllmRope, rotated: np.ndarray, rotary_dim: int, neox: bool, dtype: str) -> list[dict[str, Any]]:
    """Every length's comparison; a CtxevalError naming the first that fails, before anything is generated."""
    checks = []
    for length in rope.lengths:
        check = compare_rotation(rotated, rope.expected[length], length, rotary_dim, neox, dtype)
        checks.append(check)
        if not check["passed"]:
            raise CtxevalError(
                f"{rope.spec.label}: vLLM's rotary table differs from ctxeval's {rope.spec.name} at length {length:,}: "
                f"angle off by {check['max_angle_diff']:.2e} rad at position {check['worst_position']:,}, pair "
                f"{check['worst_pair']} (magnitude by {check['max_magnitude_rel_diff']:.1e}); vLLM did not apply the "
                "method as ctxeval defines it, so nothing was generated"
            )
    return checks
