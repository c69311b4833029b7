"""Memory one evaluation point needs, from the model config alone (`ctxeval ppl --dry-run`).

For a length L (bytes b per weight/activation element: 4 fp32, 2 bf16/fp16):
  weights      parameters x b; parameters counted from the config: embeddings (x2 if untied) + per layer
               q/k/v/o projections (GQA-aware) + MLP (3 x hidden x intermediate, x experts for MoE) + norms
  activations  inference, no gradients: the residual stream and its normed copy (2 L h), plus the larger of the
               attention block (q, k, v, output: L (2 H + 2 Hkv) d) and the MLP block (3 L I) of one layer
  attention    sdpa / flash: O(L d) workspace, ~0; eager: the scores and probabilities of one layer,
               2 H L^2 x b (the reason long contexts need sdpa or flash); a sliding-window model under sdpa or
               eager: + its L x L boolean mask (L^2 bytes: transformers builds it, flash-attention 2 does not)
  logits       ctxeval's chunked loss: one chunk of C positions x vocab in float32, plus its log-softmax:
               2 C V x 4 bytes (never L x V)
  KV cache     needle/passkey generation keeps 2 x layers x Hkv x d x L x b
  methods      with attention methods (Self-Extend, ReRoPE, log-n), the largest extra workspace of one attention call
               among the methods asked, on the kernel each runs on (attention_kernels.workspace_bytes: O(L d) for the
               fused and query-scale paths, + 256 MiB of score maps for the chunked reference), counted in
               `attention`; fused decoding keeps one more key tensor per layer (its far keys), counted in the KV cache
The total for `ppl` is weights + activations + attention + logits; add the KV cache for `needle --scoring
generate`. Allocator fragmentation and the CUDA context (~0.5 GiB) come on top.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..attention.kernels import choose_kernel, far_cache_bytes, workspace_bytes
from ..errors import CtxevalError
from ..rope.geometry import require_trained_length
from .load import load_hf_config, resolve_device

GIB = 1024**3
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class MemoryEstimate:
    length: int
    weights: float  # bytes
    activations: float
    attention: float
    logits: float
    kv_cache: float

    @property
    def ppl_total(self) -> float:
        return self.weights + self.activations + self.attention + self.logits


def count_parameters(cfg: Any) -> int:
    """Dense decoder parameter count from a transformers config (text part)."""
    t = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    h, n = int(t.hidden_size), int(t.num_hidden_layers)
    heads = int(t.num_attention_heads)
    kv = int(getattr(t, "num_key_value_heads", None) or heads)
    d = int(getattr(t, "head_dim", None) or h // heads)
    inter = int(getattr(t, "intermediate_size", None) or 4 * h)
    experts = int(getattr(t, "num_local_experts", None) or getattr(t, "num_experts", None) or 1)
    vocab = int(t.vocab_size)
    tied = bool(getattr(t, "tie_word_embeddings", getattr(cfg, "tie_word_embeddings", False)))
    attn = h * heads * d + 2 * h * kv * d + heads * d * h
    moe_inter = getattr(t, "moe_intermediate_size", None)
    if experts > 1 and moe_inter:  # Qwen-MoE / DeepSeek style: small experts (+ shared experts)
        shared = int(getattr(t, "shared_expert_intermediate_size", None) or 0)
        shared += int(getattr(t, "n_shared_experts", None) or 0) * int(moe_inter)
        mlp = 3 * h * (int(moe_inter) * experts + shared) + h * experts  # + router
    else:
        mlp = 3 * h * inter * experts
    return vocab * h * (1 if tied else 2) + n * (attn + mlp + 2 * h) + h


def sliding_window_of(cfg: Any) -> int | None:
    """The sliding-window size the model's attention uses (Mistral: 4096), or None (Qwen2 ships one unused)."""
    t = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    window = getattr(t, "sliding_window", None)
    if not window or getattr(t, "use_sliding_window", True) is False:
        return None
    return int(window)


def estimate(
    cfg: Any,
    lengths: tuple[int, ...],
    dtype: str,
    attn: str,
    chunk: int,
    attention_specs: tuple[tuple[Any, ...], ...] = (),
    device_type: str = "cpu",
) -> list[MemoryEstimate]:
    t = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    b = BYTES[dtype]
    h, n = int(t.hidden_size), int(t.num_hidden_layers)
    heads = int(t.num_attention_heads)
    kv = int(getattr(t, "num_key_value_heads", None) or heads)
    d = int(getattr(t, "head_dim", None) or h // heads)
    inter = int(getattr(t, "intermediate_size", None) or 4 * h)
    vocab = int(t.vocab_size)
    weights = count_parameters(cfg) * b
    rows = []
    for L in lengths:
        activations = (2 * L * h + max(L * (2 * heads + 2 * kv) * d, 3 * L * inter)) * b
        attention = 2 * heads * L * L * b if attn == "eager" else 0.0
        if sliding_window_of(cfg) and attn != "flash_attention_2":
            attention += L * L  # the materialised sliding-window mask (bool)
        logits = 2 * min(chunk, L) * vocab * 4
        kv_cache = 2 * n * kv * d * L * b
        extra = [
            (workspace_bytes(specs, kernel, L, heads, kv, d, b), far_cache_bytes(specs, kernel, L, n, kv, d, b))
            for specs in attention_specs
            if specs
            for kernel in (choose_kernel(specs, device_type),)
        ]
        attention += max((e[0] for e in extra), default=0.0)
        kv_cache += max((e[1] for e in extra), default=0.0)
        rows.append(MemoryEstimate(L, weights, activations, attention, logits, kv_cache))
    return rows


@dataclass(frozen=True)
class DryRun:
    """`ctxeval ppl --dry-run` for one model: the estimate per length, from the config alone."""

    parameters: int
    dtype: str  # resolved (auto -> bfloat16 on a GPU, float32 on CPU)
    dtype_note: str
    rows: list[MemoryEstimate]


def dry_run(
    model: str,
    lengths: tuple[int, ...],
    dtype: str,
    device: str,
    attn: str,
    chunk: int,
    trust_remote_code: bool,
    attention_specs: tuple[tuple[Any, ...], ...] = (),
) -> DryRun:
    """Estimates for `lengths` (default: 0.5x, 1x, 2x the trained length) without loading any weights."""
    cfg = load_hf_config(model, trust_remote_code=trust_remote_code)
    if dtype == "auto":
        dtype = "bfloat16" if resolve_device(device).startswith("cuda") else "float32"
        note = f"dtype auto on this machine: {dtype} (bfloat16 on a GPU, float32 on CPU)"
    else:
        note = f"dtype {dtype}"
    if dtype not in BYTES:
        raise CtxevalError(f"--dtype must be one of auto, {', '.join(BYTES)}, got '{dtype}'")
    if not lengths:
        L = require_trained_length(cfg, model)
        lengths = tuple(sorted({max(2, int(L * m)) for m in (0.5, 1, 2)}))
    device_type = resolve_device(device).split(":")[0]
    return DryRun(
        count_parameters(cfg), dtype, note, estimate(cfg, lengths, dtype, attn, chunk, attention_specs, device_type)
    )


def loaded_notes(lm: Any, model: str, method_names: list[str], device_map: str | None) -> list[str]:
    """What the user should know about the loaded model: layers offloaded by --device-map, a sliding window's L x L
    mask, a shipped rope_type that method none replaces."""
    notes = []
    offloaded = sorted({str(v) for v in (getattr(lm.model, "hf_device_map", None) or {}).values()} & {"cpu", "disk"})
    if device_map and offloaded:
        notes.append(
            f"--device-map put layers on {' and '.join(offloaded)}: every forward streams them through "
            "the GPU (orders of magnitude slower); give more GPUs or --max-memory, or a smaller --dtype"
        )
    window = sliding_window_of(lm.model.config)
    if window and lm.attn_implementation != "flash_attention_2":
        notes.append(
            f"{model} attends within a {window:,}-token sliding window; under {lm.attn_implementation} "
            "transformers builds an L x L mask for it (16 GiB at 128k, no flash kernel): on a GPU use "
            "--attn flash_attention_2 (`ctxeval ppl --dry-run` counts the mask)"
        )
    shipped = lm.rope.shipped.get("rope_type", "default")
    if shipped != "default" and "none" in method_names:
        notes.append(
            f"this checkpoint ships rope_type={shipped}; method none replaces it with plain RoPE at the "
            "original length; add --method native to measure the RoPE it ships"
        )
    return notes
