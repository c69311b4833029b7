"""Context-extension methods that change the attention itself, as math on the q and k a model's attention function
receives (already rotated by RoPE at their true positions).

Every method here keeps RoPE's true relative distance d = i - j for near pairs and gives far pairs another one:
  self-extend   Jin et al. 2024, "LLM Maybe LongLM: Self-Extend LLM Context Window Without Tuning" (datamllab/LongLM,
                self_extend_patch/Llama_4_40.py): d < W (neighbor window) keeps its positions; farther pairs use
                grouped positions, queries i // G + W - W // G and keys j // G (group size G), one softmax over both.
                (The repository's older self_extend_patch/Llama.py shifts queries by W - W / G, a float that differs
                when G does not divide W; its fix, commit 715c1e3, reached Llama_4_40.py only.)
  rerope        Su 2023, "ReRoPE" (kexue.fm/archives/9708; bojone/rerope rerope_patch.py): d < w keeps RoPE; d >= w is
                scored at distance w (q rotated to position w, k unrotated).
  leaky-rerope  the same patch family (leaky_rerope_patch.py): d >= w at distance w + (d - w) / k.
  logn          queries scaled by max(1, log(i + 1) / log L) at position i (L the trained length; Su's patches apply it
                with ReRoPE, Self-Extend offers it as scale_base); composable with every other method.
Because a rotation by a angle a followed by one by b is a rotation by a + b, a query rotated at position i is moved
to position p by rotating it by p - i: no pre-RoPE copy of q or k is needed, and cached keys (post-RoPE in
transformers' caches) serve generation exactly.

Memory: queries are processed in chunks, each against every key (O(chunk x L) scores per head, two maps for the
remapping methods), never an L x L map at long L. Softmax in float32, as the reference patches do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import CtxevalError
from ..rope.params import Param, coerce_param
from .temperature import LAYERS, check_query_scales, first_scaled_position, query_temperature

if TYPE_CHECKING:
    import torch

SCORE_BUDGET_BYTES = 256 * 2**20  # float32 score maps per query chunk (both maps of a remapping method together)


@dataclass(frozen=True)
class AttentionMethod:
    name: str
    summary: str
    params: tuple[Param, ...]
    remaps: bool  # gives far pairs another relative position (at most one such method per spec)

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)


DCA_SCALES = ("chunkllama", "vllm", "none")
STRING_ATTENTION_FACTOR = 0.1 * math.log(2) + 1  # STRING's string_for_llama.py: attention_factor

_LOGN_LENGTH = Param(
    "length", int, None, "logn's L: log(i+1)/log L (default: the model's trained length)", positive=True
)

ATTENTION_METHODS: dict[str, AttentionMethod] = {
    m.name: m
    for m in (
        AttentionMethod(
            "self-extend",
            "Self-Extend: neighbor window W at true positions, grouped positions (/G) beyond",
            (
                Param("group_size", int, 8, "G: far positions are floor-divided by G", minimum=1),
                Param("neighbor_window", int, 1024, "W: distances < W keep their positions", minimum=1),
            ),
            remaps=True,
        ),
        AttentionMethod(
            "rerope",
            "ReRoPE: RoPE inside the window w, every farther distance scored as w",
            (
                Param("window", int, 512, "w: distances >= w are clamped to w", minimum=1),
                Param("logn", bool, True, "scale queries by max(1, log(i+1)/log L), as Su's patch does"),
                _LOGN_LENGTH,
            ),
            remaps=True,
        ),
        AttentionMethod(
            "leaky-rerope",
            "Leaky ReRoPE: RoPE inside w, distance w + (d - w)/k beyond",
            (
                Param("window", int, 512, "w: distances < w keep RoPE", minimum=1),
                Param("k", float, 16.0, "slope 1/k of the distance beyond the window", minimum=1.0),
                Param("logn", bool, True, "scale queries by max(1, log(i+1)/log L), as Su's patch does"),
                _LOGN_LENGTH,
            ),
            remaps=True,
        ),
        AttentionMethod("logn", "log-n scaling: queries x max(1, log(i+1)/log L)", (_LOGN_LENGTH,), remaps=False),
        AttentionMethod(
            "dca",
            "Dual Chunk Attention: positions within chunks; intra / successive / inter-chunk rules",
            (
                Param(
                    "chunk_size", int, None, "ChunkLlama's chunk_size (default: 3L/4, L the trained length)", minimum=2
                ),
                Param("local_size", int, None, "local window kept at true distance (default: L/8)", minimum=1),
                Param(
                    "scale",
                    str,
                    "chunkllama",
                    "temperature past the trained length: chunkllama (q and k rotary parts x 0.05 ln(n/L)+1), "
                    "vllm (q and k x 0.1 ln(n/original)+1, as vLLM and Qwen's 1M configs), none",
                    choices=DCA_SCALES,
                ),
                Param("original", int, None, "vllm scale's original length (default: the trained length)", minimum=1),
            ),
            remaps=True,
        ),
        AttentionMethod(
            "string",
            "STRING: true positions up to the shift S, farther keys scored S - W closer",
            (
                Param(
                    "shift", int, None, "S: the shifted offset (default: int(0.33 L), L the trained length)", minimum=1
                ),
                Param("local", int, 128, "W: the shifted part starts at distance W", minimum=0),
                Param(
                    "attention_factor",
                    float,
                    STRING_ATTENTION_FACTOR,
                    "cos and sin x this factor (the reference's 0.1 ln 2 + 1)",
                    positive=True,
                ),
            ),
            remaps=True,
        ),
        AttentionMethod(  # query temperatures: attention/temperature.py
            "qscale-llama4",
            "Llama 4's attn_temperature_tuning: q x 1 + attn_scale ln(floor((i+1)/floor_scale) + 1)",
            (
                Param("attn_scale", float, 0.1, "the coefficient of the log", positive=True),
                Param("floor_scale", int, 8192, "positions per step of the floor", minimum=2),
                Param("layers", str, "nope", "nope: the layers whose RoPE is off (Llama 4's); all", choices=LAYERS),
            ),
            remaps=False,
        ),
        AttentionMethod(
            "qscale-mistral",
            "Mistral's llama_4_scaling_beta: q x 1 + beta ln(1 + floor(i/original))",
            (
                Param("beta", float, 0.1, "the coefficient of the log", positive=True),
                Param("original", int, None, "positions per step (default: the trained length)", positive=True),
                Param("layers", str, "all", "all, or nope: the layers whose RoPE is off", choices=LAYERS),
            ),
            remaps=False,
        ),
    )
}


def get_attention_method(name: str) -> AttentionMethod:
    if name not in ATTENTION_METHODS:
        raise CtxevalError(f"unknown attention method '{name}'; choose one of: {', '.join(ATTENTION_METHODS)}")
    return ATTENTION_METHODS[name]


@dataclass(frozen=True)
class AttentionSpec:
    """One attention method with its validated parameters (defaults filled)."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)  # every parameter, defaults filled
    given: dict[str, Any] = field(default_factory=dict)  # the ones the user wrote (what the label shows)


def resolve_attention(name: str, given: dict[str, Any]) -> AttentionSpec:
    """Validate an attention method's parameters and fill its defaults."""
    method = get_attention_method(name)
    params: dict[str, Any] = {}
    for key, value in given.items():
        p = method.param(key)
        if p is None:
            valid = ", ".join(q.name for q in method.params)
            raise CtxevalError(f"attention method '{name}' does not take '{key}'; it takes: {valid}")
        params[key] = None if value is None else coerce_param(name, p, value)
    given_typed = dict(params)
    for p in method.params:
        params.setdefault(p.name, p.default)
    if name == "self-extend" and params["neighbor_window"] < params["group_size"]:
        raise CtxevalError(
            f"self-extend: neighbor_window ({params['neighbor_window']}) must be >= group_size "
            f"({params['group_size']}): the grouped query position i//G + W - W//G assumes W >= G"
        )
    if name == "dca" and params["chunk_size"] and params["local_size"]:
        dca_sizes(AttentionSpec(name, params), params["chunk_size"])
    if name == "string" and params["shift"] is not None and params["local"] > params["shift"]:
        raise CtxevalError(
            f"string: local ({params['local']}) must be <= shift ({params['shift']}): the shifted part scores a key "
            "at distance d as d - shift + local, which would move it farther than its true distance"
        )
    return AttentionSpec(name, params, given_typed)


def dca_sizes(spec: AttentionSpec, original_length: int) -> tuple[int, int]:
    """DCA's (chunk_size, local_size): the given ones, else ChunkLlama's replace_with_chunkllama defaults 3L/4 and L/8
    (L the trained length). The chunk length c = chunk_size - local_size is what positions are taken modulo."""
    chunk = spec.params.get("chunk_size") or original_length * 3 // 4
    local = spec.params.get("local_size") or original_length // 8
    if local < 1 or chunk <= local:
        raise CtxevalError(
            f"dca: chunk_size ({chunk}) must be larger than local_size ({local}): positions are taken modulo "
            "chunk_size - local_size; give a larger chunk_size or a smaller local_size"
        )
    return chunk, local


def string_sizes(spec: AttentionSpec, original_length: int) -> tuple[int, int]:
    """STRING's (shift S, local W): the given ones, else the reference's int(0.33 L) and 128."""
    shift = spec.params.get("shift") or int(0.33 * original_length)
    local = spec.params.get("local", 128)
    if shift < 1 or shift > original_length:
        raise CtxevalError(
            f"string: shift {shift} must be between 1 and the trained length {original_length}: STRING reuses "
            "positions the model was trained on (the authors suggest 0.25-0.4 of it)"
        )
    if local > shift:
        raise CtxevalError(f"string: local ({local}) must be <= shift ({shift}); lower local or raise shift")
    return shift, local


def check_combination(specs: tuple[AttentionSpec, ...]) -> None:
    remapping = [s.name for s in specs if get_attention_method(s.name).remaps]
    if len(remapping) > 1:
        raise CtxevalError(
            f"{' and '.join(remapping)} both change far pairs' positions; combine at most one of "
            "self-extend, rerope, leaky-rerope (with logn and a frequency method)"
        )
    names = [s.name for s in specs]
    if len(set(names)) < len(names):
        raise CtxevalError(f"attention method given twice: {'+'.join(names)}")
    logn_inside = [s.name for s in specs if s.params.get("logn")]
    if logn_inside and "logn" in names:
        raise CtxevalError(f"{logn_inside[0]} already applies logn (its logn=true); drop +logn or set logn=false")
    check_query_scales(specs)


def window_of(spec: AttentionSpec) -> int | None:
    """The distance from which a remapping method changes pairs (Self-Extend's W, ReRoPE's w); None for logn."""
    return spec.params.get("neighbor_window") or spec.params.get("window")


def logn_length(spec: AttentionSpec, original_length: int) -> int | None:
    """The L of log(i+1)/log L when the spec scales queries by log-n (logn, or rerope's logn=true), else None."""
    if spec.name == "logn" or spec.params.get("logn"):
        return spec.params.get("length") or original_length
    return None


def check_sizes(specs: tuple[AttentionSpec, ...], original_length: int) -> None:
    """DCA's and STRING's sizes on a model of trained length `original_length` (defaults filled): one-line errors."""
    for spec in specs:
        if spec.name == "dca":
            dca_sizes(spec, original_length)
        elif spec.name == "string":
            string_sizes(spec, original_length)


def in_effect(spec: AttentionSpec, original_length: int) -> dict[str, Any]:
    """What DCA and STRING apply on a model of trained length `original_length` (their defaults filled), for
    run.json; {} for the other methods, whose parameters say it all."""
    if spec.name == "dca":
        chunk, local = dca_sizes(spec, original_length)
        scale, scale_from = spec.params.get("scale", "chunkllama"), dca_scale_length(spec, original_length)
        formula = {
            "chunkllama": f"q and k rotary dims x (0.05 ln(n / {scale_from}) + 1) for n > {scale_from}",
            "vllm": f"logits x max(1, 0.1 ln(n / {scale_from}) + 1)^2",
            "none": "none",
        }[scale]
        return {"chunk_size": chunk, "local_size": local, "chunk_len": chunk - local, "temperature": formula}
    if spec.name == "string":
        shift, local = string_sizes(spec, original_length)
        factor = spec.params["attention_factor"]
        return {"shift": shift, "local": local, "rotary_logit_factor": factor * factor}
    return {}


def attention_length_dependent(spec: AttentionSpec) -> bool:
    """Whether the method scores a pair differently in a longer sequence (DCA's temperature is set by the
    sequence's length): then a prefix of one forward does not measure a shorter length."""
    return spec.name == "dca" and spec.params.get("scale", "chunkllama") != "none"


def dca_scale_length(spec: AttentionSpec, original_length: int) -> int | None:
    """The length n past which DCA's temperature is above 1 (None: scale=none)."""
    scale = spec.params.get("scale", "chunkllama")
    if scale == "none":
        return None
    return (spec.params.get("original") or original_length) if scale == "vllm" else original_length


def specs_logn_length(specs: tuple[AttentionSpec, ...], original_length: int) -> int | None:
    """The L of log-n scaling when any of `specs` scales queries by it (logn_length), else None."""
    return next((length for length in (logn_length(s, original_length) for s in specs) if length), None)


def noop_reason(specs: tuple[AttentionSpec, ...], lengths: list[int], original_length: int) -> str | None:
    """Why these methods change nothing at any of `lengths` (then running them only costs time), else None."""
    longest = max(lengths)
    parts = []
    for spec in specs:
        if spec.name == "string":
            return None  # below its shift it is RoPE with cos and sin x attention_factor, not RoPE itself
        if spec.name == "dca":
            chunk, local = dca_sizes(spec, original_length)
            scale_from = dca_scale_length(spec, original_length)
            if longest > chunk - local or (scale_from is not None and longest > scale_from):
                return None
            parts.append(
                f"dca's chunk {chunk:,} - local {local:,} = {chunk - local:,} >= the longest length {longest:,}"
            )
            continue
        window, logn = window_of(spec), logn_length(spec, original_length)
        first = first_scaled_position(spec, original_length)
        if (window is not None and window < longest) or (logn is not None and longest > logn):
            return None
        if first is not None and longest > first:
            return None
        if first is not None:
            parts.append(f"{spec.name}'s q scale is 1 below position {first:,}")
        if window is not None:
            parts.append(f"{spec.name}'s window {window} >= the longest length {longest}")
        if logn is not None:
            parts.append(f"logn is 1 up to L={logn}")
    return "; ".join(parts) + ": identical to the model without them"


def far_positions(spec: AttentionSpec, q_pos: Any, k_pos: Any) -> tuple[Any, Any]:
    """The positions a remapping method gives the query and the key of a far pair (distance >= window_of(spec)),
    as the papers write them; numpy arrays or torch tensors (floor division on both)."""
    p = spec.params
    if spec.name == "self-extend":
        g, w = p["group_size"], p["neighbor_window"]
        return q_pos // g + w - w // g, k_pos // g
    if spec.name == "rerope":
        return q_pos * 0 + p["window"], k_pos * 0
    if spec.name == "leaky-rerope":
        w, k = p["window"], p["k"]
        return w + (q_pos - w) / k, k_pos / k
    raise ValueError(f"{spec.name} does not remap positions")


# ---------------------------------------------------------------------------------------------------------------
# relative positions (what `ctxeval plan --plot` draws)


def change_points(spec: AttentionSpec, original_length: int) -> list[int]:
    """The distances (key at 0) at which a remapping method's rule changes: its window, DCA's chunk bounds, STRING's
    shift."""
    if spec.name == "dca":
        chunk, local = dca_sizes(spec, original_length)
        return [chunk - local, chunk, 2 * (chunk - local)]
    if spec.name == "string":
        return [string_sizes(spec, original_length)[0]]
    window = window_of(spec)
    return [] if window is None else [window]


def relative_position(spec: AttentionSpec, distance: np.ndarray, original_length: int = 0) -> np.ndarray:
    """The relative position a query at `distance` tokens after a key is scored at (query at distance, key at 0 for
    self-extend's grouping and DCA's chunks: they depend on both positions, shown here for j = 0; STRING's key at
    exactly S, seen by both of its parts, is shown at its shifted position)."""
    d = np.asarray(distance, dtype=np.float64)
    if spec.name == "dca":
        chunk, local = dca_sizes(spec, original_length)
        c = chunk - local
        return np.where(d < c, d, np.where(d < 2 * c, np.minimum(d, chunk), min(2 * c - 1, chunk)))
    if spec.name == "string":
        shift, local = string_sizes(spec, original_length)
        return np.where(d < shift, d, d - shift + local)
    if window_of(spec) is None:
        return d
    q_far, k_far = far_positions(spec, d, np.zeros_like(d))
    return np.where(d < window_of(spec), d, q_far - k_far)


# ---------------------------------------------------------------------------------------------------------------
# attention


def rotate(x: torch.Tensor, delta: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotate RoPE's pairs of x by `delta` more positions (transformers' rotate_half layout; dims past the rotary dim,
    partial rotary, are left as they are). x: (B, ..., T, D), delta: (B, T), inv_freq: (rd/2,)."""
    import torch

    rd = 2 * inv_freq.numel()
    angle = delta.to(torch.float64)[..., None] * inv_freq.to(torch.float64)  # (B, T, rd/2)
    angle = torch.cat((angle, angle), dim=-1)
    shape = (x.shape[0],) + (1,) * (x.dim() - 3) + angle.shape[1:]
    cos, sin = angle.cos().to(x.dtype).view(shape), angle.sin().to(x.dtype).view(shape)
    head, rest = x[..., :rd], x[..., rd:]
    half = rd // 2
    turned = torch.cat((-head[..., half:], head[..., :half]), dim=-1)
    return torch.cat((head * cos + turned * sin, rest), dim=-1)


def logn_scale(positions: torch.Tensor, length: int) -> torch.Tensor:
    """max(1, log(i + 1) / log L) per query position i.  # (B, T)"""
    import torch

    return (torch.log(positions.to(torch.float64) + 1) / math.log(length)).clamp(min=1.0)


def attend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float,
    inv_freq: torch.Tensor,
    specs: tuple[AttentionSpec, ...],
    original_length: int,
    chunk: int | None = None,
) -> torch.Tensor:
    """Attention under `specs`. query (B, Hq, Tq, D), key/value (B, Hk, Tk, D) (Hq a multiple of Hk: grouped-query
    heads share their key head), positions q_pos (B, Tq) and k_pos (B, Tk), mask: None (causal by index), bool
    (True = attend) or additive float, (B or 1, 1, Tq, Tk). Returns (B, Tq, Hq, D) in query's dtype, as
    transformers' attention functions do."""
    import torch

    batch, heads, tq, dim = query.shape
    kv_heads, tk = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    remap = next((s for s in specs if get_attention_method(s.name).remaps), None)
    logn = specs_logn_length(specs, original_length)
    kf = key.float()  # (B, Hk, Tk, D)
    vf = value.float()
    far_keys, window = None, 0
    if remap is not None:
        q_far, k_far = far_positions(remap, q_pos, k_pos)
        q_delta, window = q_far - q_pos, window_of(remap)  # far queries and keys are rotated on by the difference
        far_keys = rotate(kf, k_far - k_pos, inv_freq)
    maps = 2 if remap is not None else 1
    if chunk is None:
        chunk = max(1, SCORE_BUDGET_BYTES // (batch * heads * max(tk, 1) * 4 * (maps + 1)))
    out = torch.empty(batch, tq, heads, dim, dtype=query.dtype, device=query.device)
    offset = tk - tq  # query row t is key index offset + t (positions are consecutive, padding shifts a row alike)
    floor = torch.finfo(torch.float32).min
    for start in range(0, tq, chunk):
        rows = slice(start, min(tq, start + chunk))
        n = rows.stop - rows.start
        visible = offset + rows.stop  # keys past the chunk's last query are never seen (causal): not computed
        # keys up to `far_end` are >= window away from every query of the chunk: only the far map is needed there
        far_end = max(0, min(visible, offset + rows.start - window + 1)) if remap is not None else 0
        q = query[:, :, rows].float().reshape(batch, kv_heads, groups, n, dim)  # (B, Hk, g, c, D)
        if logn is not None:
            q = q * logn_scale(q_pos[:, rows], logn).float()[:, None, None, :, None]
        band = slice(far_end, visible)
        scores = torch.matmul(q, kf[:, :, None, band].transpose(-1, -2))  # (B, Hk, g, c, band)
        if remap is not None:
            q_far = rotate(q, q_delta[:, rows], inv_freq)  # (B, Hk, g, c, D)
            far = torch.matmul(q_far, far_keys[:, :, None, band].transpose(-1, -2))
            near = (q_pos[:, rows, None] - k_pos[:, None, band]) < window  # (B, c, band)
            scores = torch.where(near[:, None, None], scores, far)
            if far_end:
                scores = torch.cat((torch.matmul(q_far, far_keys[:, :, None, :far_end].transpose(-1, -2)), scores), -1)
        scores = scores * scaling  # (B, Hk, g, c, visible)
        if mask is None:
            causal = (
                torch.arange(visible, device=query.device)[None, :]
                <= (offset + torch.arange(rows.start, rows.stop, device=query.device))[:, None]
            )  # (c, visible)
            scores = scores.masked_fill(~causal, floor)
        else:
            m = mask[:, :, rows, :visible][:, :, None]  # (B, 1, 1, c, visible)
            scores = scores.masked_fill(~m, floor) if m.dtype == torch.bool else scores + m.float()
        probs = torch.softmax(scores, dim=-1)
        context = torch.matmul(probs, vf[:, :, None, :visible])  # (B, Hk, g, c, D)
        out[:, rows] = context.reshape(batch, heads, n, dim).transpose(1, 2).to(query.dtype)
    return out


def pair_positions(spec: AttentionSpec, qi: torch.Tensor, kj: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The positions the method gives query i and key j of each pair, as the papers write them (float64)."""
    import torch

    qi, kj = qi.to(torch.float64), kj.to(torch.float64)
    if window_of(spec) is None:
        return qi, kj
    far = (qi - kj) >= window_of(spec)
    q_far, k_far = far_positions(spec, qi, kj)
    return torch.where(far, q_far, qi), torch.where(far, k_far, kj)


def reference_attention(
    q_raw: torch.Tensor,
    k_raw: torch.Tensor,
    value: torch.Tensor,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    inv_freq: torch.Tensor,
    specs: tuple[AttentionSpec, ...],
    scaling: float,
    original_length: int,
) -> torch.Tensor:
    """The methods straight from the papers, one query row at a time in float64 (for the probe): pre-RoPE q and k
    rotated to each pair's own positions, causal softmax. q_raw (H, Tq, D), k_raw/value (H, Tk, D) (key heads
    already repeated), positions (Tq,), (Tk,). Returns (Tq, H, D)."""
    import torch

    remap = next((s for s in specs if get_attention_method(s.name).remaps), AttentionSpec("none"))
    logn = specs_logn_length(specs, original_length)
    heads, tq, _ = q_raw.shape
    rows = []
    for i in range(tq):
        qi, kj = pair_positions(remap, q_pos[i].expand(k_pos.shape), k_pos)  # (Tk,)
        q = q_raw[:, i].double()[:, None].expand(heads, k_pos.numel(), -1)
        if logn is not None:
            q = q * float(logn_scale(q_pos[i : i + 1], logn)[0])
        temperature = query_temperature(specs, q_pos[i : i + 1], original_length)
        q = q if temperature is None else q * float(temperature[0])
        scores = (rotate(q[None], qi[None], inv_freq)[0] * rotate(k_raw.double()[None], kj[None], inv_freq)[0]).sum(-1)
        scores = (scores * scaling).masked_fill((k_pos > q_pos[i])[None], float("-inf"))  # (H, Tk)
        rows.append((torch.softmax(scores, dim=-1)[:, None] @ value.double())[:, 0])  # (H, D)
    return torch.stack(rows)
