"""ReRoPE, leaky ReRoPE (log-n included) and Self-Extend: the original patches' attention, transcribed, against ctxeval.

The originals are monkey-patches of old transformers versions (not installable here, no network in CI), so the part of
each patched forward that turns q, k, v into the attention output is transcribed below as a plain function, with the
file and line of every step:

  bojone/rerope acfe78840357a94d0bb504cb8865eeaa752df1a6
    rerope_patch.py        apply_rotary_pos_emb (l. 11-19), forward_with_rerope (l. 53-114; module globals
                           training_length and window, l. 129-130)
    leaky_rerope_patch.py  apply_rotary_pos_emb (l. 11-19), _init_rope (l. 22-24), forward_with_leaky_rerope
                           (l. 58-123; globals training_length, scaling_factor, window, l. 138-140)
  datamllab/LongLM cdbbb061dc76438c46d7e1ddc500f8e4bf255574
    self_extend_patch/Llama_4_40.py  repeat_kv (l. 13-22), rotate_half (l. 24-28), apply_rotary_pos_emb (l. 31-55),
                           self_extend_forward (l. 104-193). Not Llama.py: it still shifts grouped queries by
                           W - W / G (l. 134, a float); 715c1e3 fixed Llama_4_40.py only, to W - W // G (l. 131).
  and what those patches call from the transformers they were written for (pip wheels):
    transformers 4.31.0 models/llama/modeling_llama.py  _make_causal_mask (l. 43-57), LlamaRotaryEmbedding
                           (l. 92-125), LlamaLinearScalingRotaryEmbedding (l. 128-146), rotate_half (l. 173-177),
                           repeat_kv (l. 221-230)   [ReRoPE's patches: "transformers 4.31.0 测试通过"]
    transformers 4.40.0 models/llama/modeling_llama.py  LlamaRotaryEmbedding.__init__ inv_freq (l. 103) and
                           forward (l. 132-145)     [Llama_4_40.py]
  The projections before and the o_proj after are left out (o_proj is linear: equal inputs give equal outputs).

ctxeval's side is what a patched model runs (ctxeval/attention/patching.py attention_methods): transformers (installed) rotates
q and k at their true positions, then ctxeval.attention.methods.attend with the method's AttentionSpecs. Prefill (the
whole sequence) and one decoding step against cached keys are compared, float32, atol 1e-5, over 3 seeds, query
chunking off and on, and the attention masks transformers passes (none, bool, additive).
"""

import math

import numpy as np
import pytest
import torch
import torch.nn as nn

from ctxeval.attention.kernels import fused_attend
from ctxeval.attention.methods import attend
from ctxeval.specs import expand_specs

H, HKV, D, T = 4, 2, 16, 64
ATOL = 1e-5
SEEDS = (0, 1, 2)

# ===================================================================================================================
# transformers 4.31.0 / 4.40.0 (what the patches call)


# transformers 4.31.0 modeling_llama.py l. 43-57
def _make_causal_mask(input_ids_shape, dtype, device=None, past_key_values_length=0):
    bsz, tgt_len = input_ids_shape
    mask = torch.full((tgt_len, tgt_len), torch.finfo(dtype).min, device=device)
    mask_cond = torch.arange(mask.size(-1), device=device)
    mask.masked_fill_(mask_cond < (mask_cond + 1).view(mask.size(-1), 1), 0)
    mask = mask.to(dtype)

    if past_key_values_length > 0:
        mask = torch.cat([torch.zeros(tgt_len, past_key_values_length, dtype=dtype, device=device), mask], dim=-1)
    return mask[None, None, :, :].expand(bsz, 1, tgt_len, tgt_len + past_key_values_length)


# transformers 4.31.0 modeling_llama.py l. 173-177 (= Llama_4_40.py l. 24-28)
def rotate_half(x):
    """Rotates half the hidden dims of the input."""
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


# transformers 4.31.0 modeling_llama.py l. 221-230 (= Llama_4_40.py l. 13-22)
def repeat_kv(hidden_states: torch.Tensor, n_rep: int) -> torch.Tensor:
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


class LlamaRotaryEmbedding431(torch.nn.Module):
    """transformers 4.31.0 modeling_llama.py l. 92-125 (register_buffer kept)."""

    def __init__(self, dim, max_position_embeddings=2048, base=10000, device=None):
        super().__init__()

        self.dim = dim
        self.max_position_embeddings = max_position_embeddings
        self.base = base
        inv_freq = 1.0 / (self.base ** (torch.arange(0, self.dim, 2).float().to(device) / self.dim))
        self.register_buffer("inv_freq", inv_freq)

        # Build here to make `torch.jit.trace` work.
        self._set_cos_sin_cache(
            seq_len=max_position_embeddings, device=self.inv_freq.device, dtype=torch.get_default_dtype()
        )

    def _set_cos_sin_cache(self, seq_len, device, dtype):
        self.max_seq_len_cached = seq_len
        t = torch.arange(self.max_seq_len_cached, device=device, dtype=self.inv_freq.dtype)

        freqs = torch.einsum("i,j->ij", t, self.inv_freq)
        # Different from paper, but it uses a different permutation in order to obtain the same calculation
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos_cached", emb.cos()[None, None, :, :].to(dtype), persistent=False)
        self.register_buffer("sin_cached", emb.sin()[None, None, :, :].to(dtype), persistent=False)

    def forward(self, x, seq_len=None):
        # x: [bs, num_attention_heads, seq_len, head_size]
        if seq_len > self.max_seq_len_cached:
            self._set_cos_sin_cache(seq_len=seq_len, device=x.device, dtype=x.dtype)

        return (
            self.cos_cached[:, :, :seq_len, ...].to(dtype=x.dtype),
            self.sin_cached[:, :, :seq_len, ...].to(dtype=x.dtype),
        )


class LlamaLinearScalingRotaryEmbedding431(LlamaRotaryEmbedding431):
    """transformers 4.31.0 modeling_llama.py l. 128-146."""

    def __init__(self, dim, max_position_embeddings=2048, base=10000, device=None, scaling_factor=1.0):
        self.scaling_factor = scaling_factor
        super().__init__(dim, max_position_embeddings, base, device)

    def _set_cos_sin_cache(self, seq_len, device, dtype):
        self.max_seq_len_cached = seq_len
        t = torch.arange(self.max_seq_len_cached, device=device, dtype=self.inv_freq.dtype)
        t = t / self.scaling_factor

        freqs = torch.einsum("i,j->ij", t, self.inv_freq)
        # Different from paper, but it uses a different permutation in order to obtain the same calculation
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos_cached", emb.cos()[None, None, :, :].to(dtype), persistent=False)
        self.register_buffer("sin_cached", emb.sin()[None, None, :, :].to(dtype), persistent=False)


class LlamaRotaryEmbedding440:
    """transformers 4.40.0 modeling_llama.py l. 103 (inv_freq) and l. 132-145 (forward; the autocast guard is a no-op
    here)."""

    def __init__(self, dim, base=10000, device=None):
        self.inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float().to(device) / dim))

    def __call__(self, x, position_ids):
        inv_freq_expanded = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
        position_ids_expanded = position_ids[:, None, :].float()
        freqs = (inv_freq_expanded.float() @ position_ids_expanded.float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos()
        sin = emb.sin()
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


# ===================================================================================================================
# bojone/rerope acfe788


# rerope_patch.py l. 11-19 (leaky_rerope_patch.py l. 11-19 is the same function)
def apply_rotary_pos_emb_rerope(q, k, cos, sin, position_ids):
    # The first two dimensions of cos and sin are always 1, so we can `squeeze` them.
    cos = cos.squeeze(1).squeeze(0)  # [seq_len, dim]
    sin = sin.squeeze(1).squeeze(0)  # [seq_len, dim]
    cos = cos[position_ids].unsqueeze(1)  # [bs, 1, seq_len, dim]
    sin = sin[position_ids].unsqueeze(1)  # [bs, 1, seq_len, dim]
    q_embed = (q * cos[:, :, -q.shape[2] :]) + (rotate_half(q) * sin[:, :, -q.shape[2] :]) if q is not None else None
    k_embed = (k * cos) + (rotate_half(k) * sin) if k is not None else None
    return q_embed, k_embed


def forward_with_rerope(
    query_states,
    key_states,
    value_states,
    position_ids,
    attention_mask,
    past_key_value,
    rotary_emb,
    *,
    window,
    training_length,
):
    """rerope_patch.py forward_with_rerope from the projected states on (l. 53-55 made them (bsz, heads, q_len, D),
    pre-RoPE); self.rotary_emb = LlamaRotaryEmbedding (transformers 4.31). Returns attn_output before o_proj
    (l. 114)."""
    bsz, _, q_len, head_dim = query_states.shape
    num_heads = query_states.shape[1]
    num_key_value_groups = num_heads // key_states.shape[1]
    query_states *= (
        ((position_ids + 1)[:, None, :, None].log() / np.log(training_length)).clip(1).to(query_states.dtype)
    )  # l. 56

    kv_seq_len = key_states.shape[-2]  # l. 58
    if past_key_value is not None:  # l. 59-64
        kv_seq_len += past_key_value[0].shape[-2]
        # reuse k, v, self_attention
        key_states = torch.cat([past_key_value[0], key_states], dim=2)
        value_states = torch.cat([past_key_value[1], value_states], dim=2)
        position_ids = torch.cat([past_key_value[2], position_ids], dim=1)

    if q_len == 1:  # l. 68-74
        cos, sin = rotary_emb(value_states, seq_len=kv_seq_len)
        position_ids = (position_ids[:, -1:] - position_ids).clip(max=window)
        _, key_states = apply_rotary_pos_emb_rerope(None, key_states, cos, -sin, position_ids)
        key_states = repeat_kv(key_states, num_key_value_groups)
        value_states = repeat_kv(value_states, num_key_value_groups)
        attn_weights = torch.matmul(query_states, key_states.transpose(2, 3)) / math.sqrt(head_dim)
    else:  # l. 75-88
        cos, sin = rotary_emb(value_states, seq_len=max(kv_seq_len, window + 1))
        query_states1, key_states1 = apply_rotary_pos_emb_rerope(query_states, key_states, cos, sin, position_ids)
        query_states2, _ = apply_rotary_pos_emb_rerope(query_states, None, cos, sin, position_ids * 0 + window)

        # repeat k/v heads if n_kv_heads < n_heads
        key_states1 = repeat_kv(key_states1, num_key_value_groups)
        key_states2 = repeat_kv(key_states, num_key_value_groups)
        value_states = repeat_kv(value_states, num_key_value_groups)

        attn_weights1 = torch.matmul(query_states1, key_states1.transpose(2, 3)) / math.sqrt(head_dim)
        attn_weights2 = torch.matmul(query_states2, key_states2.transpose(2, 3)) / math.sqrt(head_dim)
        rectified_mask = (position_ids[:, -q_len:, None] - position_ids[:, None]).abs() < window
        attn_weights = torch.where(rectified_mask, attn_weights1, attn_weights2)

    assert attn_weights.size() == (bsz, num_heads, q_len, kv_seq_len)  # l. 90-94
    if attention_mask is not None:  # l. 96-101
        assert attention_mask.size() == (bsz, 1, q_len, kv_seq_len)
        attn_weights = attn_weights + attention_mask

    # upcast attention to fp32
    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query_states.dtype)  # l. 104
    attn_output = torch.matmul(attn_weights, value_states)  # l. 105

    attn_output = attn_output.transpose(1, 2).contiguous()  # l. 113
    attn_output = attn_output.reshape(bsz, q_len, num_heads * head_dim)  # l. 114
    return attn_output


def forward_with_leaky_rerope(
    query_states,
    key_states,
    value_states,
    position_ids,
    attention_mask,
    past_key_value,
    rotary_emb,
    rotary_emb2,
    *,
    window,
    training_length,
    scaling_factor,
):
    """leaky_rerope_patch.py forward_with_leaky_rerope from the projected states on (l. 58-60); _init_rope (l. 22-24):
    rotary_emb = LlamaRotaryEmbedding, rotary_emb2 = LlamaLinearScalingRotaryEmbedding(scaling_factor). Returns
    attn_output before o_proj (l. 123)."""
    bsz, _, q_len, head_dim = query_states.shape
    num_heads = query_states.shape[1]
    num_key_value_groups = num_heads // key_states.shape[1]
    query_states *= (
        ((position_ids + 1)[:, None, :, None].log() / np.log(training_length)).clip(1).to(query_states.dtype)
    )  # l. 61

    kv_seq_len = key_states.shape[-2]  # l. 63
    if past_key_value is not None:  # l. 64-69
        kv_seq_len += past_key_value[0].shape[-2]
        # reuse k, v, self_attention
        key_states = torch.cat([past_key_value[0], key_states], dim=2)
        value_states = torch.cat([past_key_value[1], value_states], dim=2)
        position_ids = torch.cat([past_key_value[2], position_ids], dim=1)

    offset = window * (scaling_factor - 1)  # l. 73
    cos, sin = rotary_emb(value_states, seq_len=kv_seq_len)  # l. 74
    cos2, sin2 = rotary_emb2(value_states, seq_len=kv_seq_len + offset)  # l. 75
    if q_len == 1:  # l. 76-83
        position_ids = position_ids[:, -1:] - position_ids
        cos = torch.cat([cos[:, :, :window], cos2[:, :, window + offset :]], axis=2)
        sin = torch.cat([sin[:, :, :window], sin2[:, :, window + offset :]], axis=2)
        _, key_states = apply_rotary_pos_emb_rerope(None, key_states, cos, -sin, position_ids)
        key_states = repeat_kv(key_states, num_key_value_groups)
        value_states = repeat_kv(value_states, num_key_value_groups)
        attn_weights = torch.matmul(query_states, key_states.transpose(2, 3)) / math.sqrt(head_dim)
    else:  # l. 84-97
        query_states1, key_states1 = apply_rotary_pos_emb_rerope(query_states, key_states, cos, sin, position_ids)
        query_states2, _ = apply_rotary_pos_emb_rerope(query_states, None, cos2, sin2, position_ids + offset)
        _, key_states2 = apply_rotary_pos_emb_rerope(None, key_states, cos2, sin2, position_ids)

        # repeat k/v heads if n_kv_heads < n_heads
        key_states1 = repeat_kv(key_states1, num_key_value_groups)
        key_states2 = repeat_kv(key_states2, num_key_value_groups)
        value_states = repeat_kv(value_states, num_key_value_groups)

        attn_weights1 = torch.matmul(query_states1, key_states1.transpose(2, 3)) / math.sqrt(head_dim)
        attn_weights2 = torch.matmul(query_states2, key_states2.transpose(2, 3)) / math.sqrt(head_dim)
        rectified_mask = (position_ids[:, -q_len:, None] - position_ids[:, None]).abs() < window
        attn_weights = torch.where(rectified_mask, attn_weights1, attn_weights2)

    assert attn_weights.size() == (bsz, num_heads, q_len, kv_seq_len)  # l. 99-103
    if attention_mask is not None:  # l. 105-110
        assert attention_mask.size() == (bsz, 1, q_len, kv_seq_len)
        attn_weights = attn_weights + attention_mask

    # upcast attention to fp32
    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query_states.dtype)  # l. 113
    attn_output = torch.matmul(attn_weights, value_states)  # l. 114

    attn_output = attn_output.transpose(1, 2).contiguous()  # l. 122
    attn_output = attn_output.reshape(bsz, q_len, num_heads * head_dim)  # l. 123
    return attn_output


# ===================================================================================================================
# datamllab/LongLM cdbbb06 self_extend_patch/Llama_4_40.py


# Llama_4_40.py l. 31-55
def apply_rotary_pos_emb_se(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin) if q is not None else None
    k_embed = (k * cos) + (rotate_half(k) * sin) if k is not None else None
    return q_embed, k_embed


def self_extend_forward(
    query_states,
    key_states,
    value_states,
    position_ids,
    attention_mask,
    past_key_value,
    rotary_emb,
    *,
    group_size_1=8,
    group_size_2=1024,
    scale_base=-1,
):
    """Llama_4_40.py self_extend_forward from the projected states on (l. 104-106); self.rotary_emb = transformers
    4.40's LlamaRotaryEmbedding; past_key_value: the (keys, values) a DynamicCache holds (pre-RoPE, l. 118 stores
    them before any rotation; update = concatenation); cache_position None. Returns attn_output before o_proj
    (l. 193)."""
    bsz, num_heads, q_len, head_dim = query_states.shape
    num_key_value_groups = num_heads // key_states.shape[1]

    if scale_base > 0:  # l. 108-112
        scaled_query = query_states * ((position_ids + 1)[:, None, :, None].log() / np.log(scale_base)).clip(1).to(
            query_states.dtype
        )  # log scale
    else:
        scaled_query = query_states

    if past_key_value is not None:  # l. 115-118
        key_states = torch.cat([past_key_value[0], key_states], dim=-2)
        value_states = torch.cat([past_key_value[1], value_states], dim=-2)
    kv_seq_len = key_states.shape[-2]  # l. 119

    query_position = position_ids  # l. 121
    key_position = (
        position_ids
        if q_len != 1
        else torch.arange(kv_seq_len, dtype=position_ids.dtype).to(query_position.device).view(1, kv_seq_len)
    )  # l. 122

    neighbor_q_cos, neighbor_q_sin = rotary_emb(value_states, query_position)  # l. 126
    neighbor_k_cos, neighbor_k_sin = rotary_emb(value_states, key_position)  # l. 127

    _re_group_size_2 = 0 if query_position.max() < group_size_2 else group_size_2  # l. 130
    group_query_position = (
        query_position // group_size_1 + _re_group_size_2 - _re_group_size_2 // group_size_1
    )  # l. 131
    group_key_position = key_position // group_size_1  # l. 132

    group_q_cos, group_q_sin = rotary_emb(value_states, group_query_position)  # l. 134
    group_k_cos, group_k_sin = rotary_emb(value_states, group_key_position)  # l. 135

    neighbor_query_states, _ = apply_rotary_pos_emb_se(
        scaled_query, None, neighbor_q_cos, neighbor_q_sin, None
    )  # l. 139
    _, neighbor_key_states = apply_rotary_pos_emb_se(None, key_states, neighbor_k_cos, neighbor_k_sin, None)  # l. 140
    group_query_states, _ = apply_rotary_pos_emb_se(scaled_query, None, group_q_cos, group_q_sin, None)  # l. 141
    _, group_key_states = apply_rotary_pos_emb_se(None, key_states, group_k_cos, group_k_sin, None)  # l. 142

    neighbor_key_states = repeat_kv(neighbor_key_states, num_key_value_groups)  # l. 146
    group_key_states = repeat_kv(group_key_states, num_key_value_groups)  # l. 147
    value_states = repeat_kv(value_states, num_key_value_groups)  # l. 148

    neighbor_attn_weights = torch.matmul(neighbor_query_states, neighbor_key_states.transpose(2, 3)) / math.sqrt(
        head_dim
    )  # l. 152
    group_attn_weights = torch.matmul(group_query_states, group_key_states.transpose(2, 3)) / math.sqrt(
        head_dim
    )  # l. 153

    if attention_mask is not None:  # l. 156-162 (cache_position None)
        causal_mask = attention_mask
        group_attn_weights = group_attn_weights + causal_mask
        neighbor_attn_weights = neighbor_attn_weights + causal_mask

    if q_len == 1:  # l. 164-174
        neighbor_attention_mask = torch.zeros((q_len, kv_seq_len), device=neighbor_attn_weights.device)
        neighbor_attention_mask[:, -group_size_2:] = 1
    elif q_len == kv_seq_len:
        neighbor_attention_mask = torch.ones((q_len, kv_seq_len), device=neighbor_attn_weights.device)
        neighbor_attention_mask = torch.tril(neighbor_attention_mask)
        if q_len - group_size_2 > 0:
            group_attention_mask = torch.tril(
                torch.ones((q_len - group_size_2, kv_seq_len - group_size_2), device=group_attn_weights.device)
            )
            neighbor_attention_mask[group_size_2:, :-group_size_2] -= group_attention_mask
    else:
        raise ValueError("q_len should be 1 or seq_len.")

    neighbor_attention_mask = neighbor_attention_mask.bool()  # l. 176
    attn_weights = torch.where(neighbor_attention_mask, neighbor_attn_weights, group_attn_weights)  # l. 177

    # upcast attention to fp32
    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query_states.dtype)  # l. 180
    attn_output = torch.matmul(attn_weights, value_states)  # l. 182 (l. 181: dropout p=0 at inference)

    attn_output = attn_output.transpose(1, 2).contiguous()  # l. 191
    attn_output = attn_output.reshape(bsz, q_len, num_heads * head_dim)  # l. 193
    return attn_output


# ===================================================================================================================
# harness


def qkv(seed):
    """Projected, pre-RoPE states as the patches see them after l. 53-55 / 58-60 / 104-106: (1, heads, T, D)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, H, T, D, generator=g)
    k = torch.randn(1, HKV, T, D, generator=g)
    v = torch.randn(1, HKV, T, D, generator=g)
    return q, k, v


def run_original(kind, params, q, k, v, decode):
    """The transcribed forward on the whole sequence (prefill) or on its last token after a cache of the others
    (decode). Causal masks as transformers builds them: _make_causal_mask for prefill (4.40's _update_causal_mask,
    l. 1093-1096, gives the same values without padding), zeros for one new token (4.31 l. 575-595: no causal part
    for a single query, an all-ones padding mask expands to zeros)."""
    pos = torch.arange(T)[None]
    if decode:
        past = (k[:, :, :-1], v[:, :, :-1], pos[:, :-1])
        args = (q[:, :, -1:].clone(), k[:, :, -1:], v[:, :, -1:], pos[:, -1:], torch.zeros(1, 1, 1, T), past)
    else:
        args = (q.clone(), k, v, pos, _make_causal_mask((1, T), torch.float32), None)
    if kind == "rerope":
        return forward_with_rerope(
            *args, LlamaRotaryEmbedding431(D), window=params["window"], training_length=params["training_length"]
        )
    if kind == "leaky-rerope":
        return forward_with_leaky_rerope(
            *args,
            LlamaRotaryEmbedding431(D),
            LlamaLinearScalingRotaryEmbedding431(D, scaling_factor=params["k"]),
            window=params["window"],
            training_length=params["training_length"],
            scaling_factor=params["k"],
        )
    if decode:
        args = args[:5] + (args[5][:2],)
    return self_extend_forward(
        *args,
        LlamaRotaryEmbedding440(D),
        group_size_1=params["G"],
        group_size_2=params["W"],
        scale_base=params["scale_base"],
    )


# (query chunk, mask): attend's paths, and the fused kernel of attention_kernels (causal and left-padding masks)
VARIANTS = ((None, "none"), (5, "bool"), (None, "additive"), ("fused", "none"), ("fused", "bool"))


def ctxeval_variants(text, original_length, q, k, v, decode, variants=VARIANTS):
    """ctxeval inside a patched model: transformers (installed) rotates q and k at their true positions, then attend()
    with the spec's attention methods; queries in one chunk or in chunks of 5, mask None (sdpa's causal), bool (sdpa)
    or additive (eager); and attention_kernels.fused_attend, the fast path, with and without a mask."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    config = LlamaConfig(hidden_size=H * D, num_attention_heads=H, num_key_value_heads=HKV, head_dim=D)
    rotary = LlamaRotaryEmbedding(config)
    pos = torch.arange(T)[None]
    cos, sin = rotary(v, pos)
    qr, kr = apply_rotary_pos_emb(q, k, cos, sin)
    specs = expand_specs([text])[0].attention if text else ()
    q_pos = pos[:, -1:] if decode else pos
    if decode:
        qr = qr[:, :, -1:]
    allowed = (torch.arange(T)[None, :] <= q_pos[0, :, None])[None, None]  # (1, 1, Tq, T)
    masks = {
        "none": None,
        "bool": allowed,
        "additive": torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min),
    }
    out = {}
    for chunk, name in variants:
        if chunk == "fused":
            got = fused_attend(qr, kr, v, q_pos, pos, masks[name], D**-0.5, rotary.inv_freq, specs, original_length)
        else:
            got = attend(
                qr, kr, v, q_pos, pos, masks[name], D**-0.5, rotary.inv_freq, specs, original_length, chunk=chunk
            )
        out[(chunk, name)] = got.reshape(1, q_pos.shape[1], H * D)
    return out


# (id, original, its parameters, ctxeval's --method text, ctxeval's original length L)
CASES = [
    ("rerope-w8-L16", "rerope", {"window": 8, "training_length": 16}, "rerope:window=8", 16),
    ("rerope-w12-L16", "rerope", {"window": 12, "training_length": 16}, "rerope:window=12", 16),
    ("rerope-w20-L32", "rerope", {"window": 20, "training_length": 32}, "rerope:window=20", 32),
    ("rerope-w1-L16", "rerope", {"window": 1, "training_length": 16}, "rerope:window=1", 16),
    ("rerope-w80-no-crossing", "rerope", {"window": 80, "training_length": 16}, "rerope:window=80", 16),
    # logn=false: the patch always scales, by 1 while positions stay below training_length; ctxeval's L=16 would scale
    ("rerope-w8-logn-off", "rerope", {"window": 8, "training_length": 4096}, "rerope:window=8,logn=false", 16),
    ("rerope-w8-logn-length", "rerope", {"window": 8, "training_length": 32}, "rerope:window=8,length=32", 4096),
    ("leaky-w8-k4-L16", "leaky-rerope", {"window": 8, "k": 4, "training_length": 16}, "leaky-rerope:window=8,k=4", 16),
    (
        "leaky-w12-k2-L16",
        "leaky-rerope",
        {"window": 12, "k": 2, "training_length": 16},
        "leaky-rerope:window=12,k=2",
        16,
    ),
    ("leaky-w5-k3-L16", "leaky-rerope", {"window": 5, "k": 3, "training_length": 16}, "leaky-rerope:window=5,k=3", 16),
    (
        "leaky-w16-k16-L32",
        "leaky-rerope",
        {"window": 16, "k": 16, "training_length": 32},
        "leaky-rerope:window=16,k=16",
        32,
    ),
    (
        "leaky-w8-k4-logn-off",
        "leaky-rerope",
        {"window": 8, "k": 4, "training_length": 4096},
        "leaky-rerope:window=8,k=4,logn=false",
        16,
    ),
    ("se-G2-W8", "self-extend", {"G": 2, "W": 8, "scale_base": -1}, "self-extend:group_size=2,neighbor_window=8", 32),
    (
        "se-G4-W16",
        "self-extend",
        {"G": 4, "W": 16, "scale_base": -1},
        "self-extend:group_size=4,neighbor_window=16",
        32,
    ),
    ("se-G3-W7", "self-extend", {"G": 3, "W": 7, "scale_base": -1}, "self-extend:group_size=3,neighbor_window=7", 32),
    (
        "se-G8-W24",
        "self-extend",
        {"G": 8, "W": 24, "scale_base": -1},
        "self-extend:group_size=8,neighbor_window=24",
        32,
    ),
    ("se-G5-W5", "self-extend", {"G": 5, "W": 5, "scale_base": -1}, "self-extend:group_size=5,neighbor_window=5", 32),
    (
        "se-G4-W80-no-crossing",
        "self-extend",
        {"G": 4, "W": 80, "scale_base": -1},
        "self-extend:group_size=4,neighbor_window=80",
        32,
    ),
    (
        "se-G4-W16-logn32",
        "self-extend",
        {"G": 4, "W": 16, "scale_base": 32},
        "self-extend:group_size=4,neighbor_window=16+logn:length=32",
        4096,
    ),
    (
        "se-G3-W7-logn16",
        "self-extend",
        {"G": 3, "W": 7, "scale_base": 16},
        "self-extend:group_size=3,neighbor_window=7+logn",
        16,
    ),
]
CROSSING = {c[0] for c in CASES if "no-crossing" not in c[0]}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tensors this small run fastest on one thread (and do not fight the other jobs for the cores)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("decode", [False, True], ids=["prefill", "decode"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_attend_equals_the_original_patch(case, decode):
    name, kind, params, text, original_length = case
    worst, n = 0.0, 0
    with torch.no_grad():
        for seed in SEEDS:
            q, k, v = qkv(seed)
            want = run_original(kind, params, q, k, v, decode)
            for (chunk, mask), got in ctxeval_variants(text, original_length, q, k, v, decode).items():
                assert got.shape == want.shape
                torch.testing.assert_close(
                    got,
                    want,
                    atol=ATOL,
                    rtol=0,
                    msg=lambda m, chunk=chunk, mask=mask: f"{name} chunk={chunk} mask={mask}: {m}",
                )
                worst, n = max(worst, float((got - want).abs().max())), n + want.numel()
            if name in CROSSING:  # the method matters here: plain causal attention is far from the original
                plain = ctxeval_variants("", original_length, q, k, v, decode, ((None, "none"),))[(None, "none")]
                assert float((plain - want).abs().max()) > 1e-2
    print(f"{name} {'decode' if decode else 'prefill'}: max abs diff {worst:.3g} over {n} values")
