"""A method as the RoPE configuration a model loads natively: the transformers 5 `rope_parameters` entry (and
transformers 4's `rope_scaling` form) that makes transformers, or vLLM through `hf_overrides`, compute the frequencies
ctxeval computes. Used by `tune --export` and by the vLLM backend; both read the RoPE back and compare it."""

from __future__ import annotations

from typing import Any

from ..errors import CtxevalError
from ..rope.methods import START_TOKENS, Geometry, compute
from ..specs import MethodSpec

# what each user of an entry adds when a spec has none
WHY_NOT = {"--export": "; the search result is in tune.md, and nothing was exported"}


def rope_parameters(spec: MethodSpec, geometry: Geometry, target: int, use: str = "--export") -> dict[str, Any]:
    """The transformers 5 `rope_parameters` entry that applies `spec` as ctxeval does (CtxevalError when none can:
    attention methods, length-dependent rules transformers computes differently, YaRN's ratio ramp)."""
    if spec.attention or spec.temperature != 1.0:
        raise CtxevalError(
            f"{use}: {spec.label} changes the attention itself, which no rope_parameters entry can "
            f"say{WHY_NOT.get(use, '')}"
        )
    p = spec.resolved
    trained = int(p.get("original_max_position_embeddings") or geometry.original_length)
    freqs = compute(spec.method, geometry, spec.params, target)
    base = {"rope_theta": geometry.base}
    if spec.name == "none":
        return {"rope_type": "default", **base}
    if spec.name == "ntk":  # a static base change is plain RoPE at the new base
        new_base = geometry.base * (geometry.default_inv_freq()[1] / freqs.inv_freq[1]) ** (geometry.rotary_dim / 2)
        return {"rope_type": "default", "rope_theta": float(new_base)}
    if spec.name == "pi":
        return {"rope_type": "linear", "factor": p["factor"], **base}
    if spec.name == "yarn":
        if p["ramp"] != "index":
            raise CtxevalError(
                f"{use}: yarn with ramp=ratio (the paper's gamma) has no transformers rope_type; use ramp=index"
            )
        return {
            "rope_type": "yarn",
            "factor": p["factor"],
            "original_max_position_embeddings": trained,
            "beta_fast": p["beta_fast"],
            "beta_slow": p["beta_slow"],
            "truncate": p["truncate"],
            "attention_factor": freqs.attention_factor,
            **base,
        }
    if spec.name == "llama3":
        return {
            "rope_type": "llama3",
            "factor": p["factor"],
            "original_max_position_embeddings": trained,
            "low_freq_factor": p["low_freq_factor"],
            "high_freq_factor": p["high_freq_factor"],
            **base,
        }
    if spec.name == "longrope":
        if p.get(START_TOKENS):
            raise CtxevalError(
                f"{use}: {spec.label} keeps plain RoPE on its first {p[START_TOKENS]} positions "
                f"(microsoft/LongRoPE's mixed embedding), which neither transformers' nor vLLM's longrope can hold; "
                f"use {START_TOKENS}=0{WHY_NOT.get(use, '')}"
            )
        return {
            "rope_type": "longrope",
            "factor": p["factor"],
            "original_max_position_embeddings": trained,
            "short_factor": list(p["short_factor"]),
            "long_factor": list(p["long_factor"]),
            "attention_factor": freqs.attention_factor,
            **base,
        }
    raise CtxevalError(
        f"{use}: {spec.name} has no rope_parameters entry (transformers applies its length rule "
        "differently or has no such rope_type); use yarn, ntk, pi, llama3 or longrope"
    )


def legacy_rope_scaling(entry: dict[str, Any]) -> dict[str, Any]:
    """The same entry in transformers 4's form: `rope_scaling` (with `type` too, for older readers) and `rope_theta`
    beside it; None for plain RoPE."""
    scaling = {k: v for k, v in entry.items() if k != "rope_theta"}
    if scaling.get("rope_type") == "default":
        return {"rope_scaling": None, "rope_theta": entry["rope_theta"]}
    return {"rope_scaling": {**scaling, "type": scaling["rope_type"]}, "rope_theta": entry["rope_theta"]}
