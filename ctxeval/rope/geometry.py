"""Config -> rotary geometry: rotary dim, base and trained length read from a transformers config in every shape
transformers 5 uses, and the one rule for a model's trained length that every command and report applies."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import CtxevalError
from ..util.numbers import MAX_TOKENS, finite_number, whole_number
from .methods import Geometry

# model_type values of popular architectures that use no RoPE (learned absolute positions or ALiBi)
NON_ROPE_MODEL_TYPES = {"gpt2", "bloom", "opt", "gpt_bigcode", "mpt", "xglm", "biogpt", "bert", "roberta", "ctrl"}


@dataclass(frozen=True)
class RopeInfo:
    """The RoPE a config describes. `geometry` is None for a model without RoPE."""

    geometry: Geometry | None
    shipped: dict[str, Any] = field(default_factory=dict)  # rope parameters the checkpoint ships (rope_type etc.)
    per_layer_types: tuple[str, ...] = ()  # Gemma 3 style: different RoPE per attention layer type
    reason: str = ""  # why there is no geometry

    def to_json(self) -> dict[str, Any]:
        g = self.geometry
        return {
            "rotary_dim": g.rotary_dim if g else None,
            "base": g.base if g else None,
            "original_length": g.original_length if g else None,
            "shipped_rope_parameters": self.shipped,
            "per_layer_types": list(self.per_layer_types),
            "no_rope_reason": self.reason or None,
        }


def rope_info_from_config(config: Any) -> RopeInfo:
    """Read rotary dim, base and original trained length from a transformers config.

    Handles `rope_parameters` (with rope_theta inside), legacy `rope_scaling` + `rope_theta`, `rotary_emb_base`,
    `partial_rotary_factor` / `rotary_pct`, multimodal configs (`text_config`), and checkpoints that already ship a
    scaling: then the reference length is the ORIGINAL one (`original_max_position_embeddings`).
    """
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    model_type = getattr(cfg, "model_type", "") or ""
    if getattr(cfg, "alibi", False) or model_type in NON_ROPE_MODEL_TYPES:
        return RopeInfo(None, reason=f"model_type '{model_type}' uses {_positions_of(cfg, model_type)}, not RoPE")
    layers_with_rope = getattr(cfg, "no_rope_layers", None)  # SmolLM3: 1 = the layer applies RoPE, 0 = NoPE
    if isinstance(layers_with_rope, (list, tuple)) and layers_with_rope and not any(layers_with_rope):
        return RopeInfo(None, reason=f"model_type '{model_type}' has RoPE off in every layer (no_rope_layers all 0)")
    params = dict(getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {})
    nested = [k for k, v in params.items() if isinstance(v, dict)]
    if nested:
        # per-layer-type RoPE: use the full-attention (global) entry as the reference geometry when present
        key = "full_attention" if "full_attention" in nested else nested[0]
        ref = dict(params[key])
        info = _rope_info(cfg, ref)
        return RopeInfo(info.geometry, {k: dict(params[k]) for k in nested}, tuple(sorted(nested)), info.reason)
    return _rope_info(cfg, params)


# learned absolute positions: a table of max_position_embeddings rows, and no position past it
LEARNED_POSITION_MODEL_TYPES = {"gpt2", "opt", "gpt_bigcode", "biogpt", "gpt_neo", "ctrl"}


def position_limit(config: Any) -> int | None:
    """The longest sequence a model with learned absolute positions can read (its table's rows); None for every
    other model, whose positions do not run out (RoPE, ALiBi, sinusoids, none)."""
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    if getattr(cfg, "model_type", "") not in LEARNED_POSITION_MODEL_TYPES:
        return None
    rows = getattr(cfg, "n_positions", None) or getattr(cfg, "max_position_embeddings", None)
    return int(rows) if rows else None


def position_encoding(config: Any) -> str:
    """How a model encodes position, as the position-encoding tables name it: RoPE, ALiBi, learned, sinusoidal,
    NoPE (no layer applies any), or RoPE with some NoPE layers (SmolLM3, Llama 4)."""
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    model_type = getattr(cfg, "model_type", "") or ""
    if getattr(cfg, "alibi", False) or model_type in NON_ROPE_MODEL_TYPES:
        return {"ALiBi": "ALiBi", "sinusoidal positions": "sinusoidal"}.get(_positions_of(cfg, model_type), "learned")
    layers_with_rope = getattr(cfg, "no_rope_layers", None)
    if isinstance(layers_with_rope, (list, tuple)) and layers_with_rope and not all(layers_with_rope):
        off = sum(1 for x in layers_with_rope if not x)
        return "NoPE" if off == len(layers_with_rope) else f"RoPE ({off} of {len(layers_with_rope)} layers NoPE)"
    return "RoPE"


def _positions_of(cfg: Any, model_type: str) -> str:
    if getattr(cfg, "alibi", False) or model_type in ("bloom", "mpt"):
        return "ALiBi"
    if model_type == "xglm":
        return "sinusoidal positions"
    return "learned absolute positions"


def _config_number(name: str, value: Any, whole: bool = False) -> Any:
    """A config value a geometry is computed from, as a number (a checkpoint's config written by hand may hold
    text, NaN or 1e30 there): one line naming the field otherwise."""
    number = whole_number(value, minimum=1, maximum=MAX_TOKENS) if whole else finite_number(value)
    if number is None:
        kind = "a whole number >= 1" if whole else "a finite number"
        raise CtxevalError(
            f"the model's config holds {name} = {value!r}, not {kind}; check that it is a causal LM "
            "checkpoint's config.json"
        )
    return number


def _rope_info(cfg: Any, params: dict[str, Any]) -> RopeInfo:
    base = params.get("rope_theta") or getattr(cfg, "rope_theta", None) or getattr(cfg, "rotary_emb_base", None)
    if base is None:
        return RopeInfo(None, reason=f"config of model_type '{getattr(cfg, 'model_type', '?')}' has no rope_theta")
    heads = getattr(cfg, "num_attention_heads", None)
    heads = _config_number("num_attention_heads", heads, whole=True) if heads is not None else None
    head_dim = getattr(cfg, "head_dim", None)
    if head_dim:
        head_dim = _config_number("head_dim", head_dim, whole=True)
    elif heads:
        head_dim = _config_number("hidden_size", getattr(cfg, "hidden_size", None), whole=True) // heads
    if not head_dim:
        return RopeInfo(None, reason="config has neither head_dim nor hidden_size/num_attention_heads")
    partial = (
        params.get("partial_rotary_factor")
        or getattr(cfg, "partial_rotary_factor", None)
        or getattr(cfg, "rotary_pct", None)
        or 1.0
    )
    rotary_dim = int(head_dim * _config_number("partial_rotary_factor", partial))
    rope_type = params.get("rope_type", params.get("type", "default"))
    max_pos = getattr(cfg, "max_position_embeddings", None)
    original = params.get("original_max_position_embeddings") or getattr(cfg, "original_max_position_embeddings", None)
    if rope_type == "default" or not original:
        original = max_pos
    if not original:
        return RopeInfo(None, reason="config has no max_position_embeddings: cannot tell the trained length")
    shipped = {k: v for k, v in params.items() if k != "type"}
    shipped.setdefault("rope_type", rope_type)
    return RopeInfo(
        Geometry(
            rotary_dim,
            float(_config_number("rope_theta", base)),
            _config_number("the trained length (max_position_embeddings)", original, whole=True),
        ),
        shipped,
    )


def trained_length(config: Any) -> int | None:
    """The length a model was trained at: its RoPE geometry's original length (a checkpoint that ships a scaling
    counts from `original_max_position_embeddings`), else `max_position_embeddings` (models without RoPE), else
    None."""
    info = rope_info_from_config(config)
    if info.geometry is not None:
        return info.geometry.original_length
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    return getattr(cfg, "max_position_embeddings", None) or None


def require_trained_length(config: Any, name: str) -> int:
    """trained_length, or a user error asking for --lengths when the config declares none."""
    length = trained_length(config)
    if not length:
        raise CtxevalError(f"'{name}' declares no trained length (max_position_embeddings); give --lengths")
    return length


def trained_length_of_record(model_record: dict[str, Any]) -> int | None:
    """The same rule applied to the `model` entry a run.json holds (LoadedModel.record())."""
    rope = model_record.get("rope") if isinstance(model_record.get("rope"), dict) else {}
    length = rope.get("original_length") or model_record.get("max_position_embeddings")
    return whole_number(length, minimum=1, maximum=MAX_TOKENS) if length else None  # None for a hand-edited value
