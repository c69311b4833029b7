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
        return RopeInfo(
            None,
            reason=f"model_type '{model_type}' uses {'ALiBi' if getattr(cfg, 'alibi', False) or model_type in ('bloom', 'mpt') else 'learned absolute positions'}, not RoPE",
        )
    params = dict(getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {})
    nested = [k for k, v in params.items() if isinstance(v, dict)]
    if nested:
        # per-layer-type RoPE: use the full-attention (global) entry as the reference geometry when present
        key = "full_attention" if "full_attention" in nested else nested[0]
        ref = dict(params[key])
        info = _rope_info(cfg, ref)
        return RopeInfo(info.geometry, {k: dict(params[k]) for k in nested}, tuple(sorted(nested)), info.reason)
    return _rope_info(cfg, params)


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
