"""Dual Chunk Attention and STRING: the original code's attention, transcribed, against ctxeval.

Both originals are monkey-patches that call flash-attn (CUDA only), so the part of each patched forward that turns
q, k, v into the attention output is transcribed below with the file and line of every step, and flash-attn's
functions are replaced by a float64 emulation with the same contract (output and log-sum-exp per row; causal and
window masks bottom-right aligned as flash-attn >= 2.1 aligns them):

  HKUNLP/ChunkLlama 2add4d7c99d24dcc1ab03414cc602abb2e28cf2c  chunkllama_attn_replace.py
      get_mscale (l. 16-19), ChunkLlamaRotaryEmbedding._set_cos_sin_cache / forward (l. 39-83),
      apply_rotary_pos_emb (l. 86-93), merge_attn_outputs (l. 96-111), do_flash_attn (l. 114-118),
      forward (l. 121-241: the prefill loop l. 155-193, the decoding branch l. 194-228),
      replace_with_chunkllama (l. 248-252: chunk_size = 3L/4, local_window = L/8)
  HKUNLP/STRING 216cc2f04cee147e8c3cfaa15723b182ecbe321e  string_for_llama.py
      apply_rotary_pos_emb (l. 168-175), RotaryEmbedding._set_cos_sin_cache (l. 302-309: cos and sin x
      attention_factor), string_flash_forward (l. 323-367), forward (l. 370-444: prefill l. 412-420, flash decoding
      l. 421-438), replace_with_string (l. 728-739: attention_factor = 0.1 ln 2 + 1)

ctxeval's side is what a patched model runs: q and k rotated at their true positions, then the fused kernels
(attention.shifted.fused_shifted) and the chunked reference (attend_shifted). Prefill and one decoding step against
cached keys, float32 on ctxeval's side, atol 1e-5, 3 seeds, grouped-query heads, lengths no chunk divides.
Differences kept (docs/protocols.md): ChunkLlama rounds its merge weights to bfloat16 (l. 107), measured here as such
a rounding; its decoding step's cached keys keep the temperature of the call that computed them (ctxeval: the
current length's), so the decoding comparison is made below the trained length, where the temperature is 1.
"""

import math

import pytest
import torch

from ctxeval.attention.methods import resolve_attention, rotate
from ctxeval.attention.shifted import attend_shifted, fused_shifted

H, HKV, D = 4, 2, 16
ATOL = 1e-5
SEEDS = (0, 1, 2)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def repeat_kv(hidden_states, n_rep):
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


def flash_attn_emulated(q, k, v, causal=False, window=(-1, -1)):
    """flash_attn_func(q, k, v, causal=..., window_size=..., return_attn_probs=True)'s (out, softmax_lse), float64.
    q (B, Tq, H, D), k/v (B, Tk, Hk, D) (grouped heads as flash-attn takes them); lse (B, H, Tq)."""
    q, k, v = q.double(), k.double(), v.double()
    groups = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(groups, 2), v.repeat_interleave(groups, 2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * q.shape[-1] ** -0.5
    tq, tk = q.shape[1], k.shape[1]
    i = torch.arange(tq)[:, None] + (tk - tq)  # bottom-right aligned
    j = torch.arange(tk)[None]
    keep = torch.ones(tq, tk, dtype=torch.bool)
    if causal:
        keep &= j <= i
    if window[0] >= 0:
        keep &= j >= i - window[0]
    scores = scores.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    return torch.einsum("bhqk,bkhd->bqhd", torch.softmax(scores, dim=-1), v), lse


# ===================================================================================================================
# ChunkLlama (chunkllama_attn_replace.py)


def get_mscale(scale=1):  # l. 16-19
    if scale <= 1:
        return 1.0
    return 0.05 * math.log(scale) + 1.0


def chunkllama_caches(seq_len, max_position_embeddings, dim, chunk_size, local_window, base=10000.0):
    """ChunkLlamaRotaryEmbedding._set_cos_sin_cache (l. 39-67) as forward (l. 69-83) returns it for seq_len (MAX_NEW_TOKENS
    l. 246), scaling_factor 1."""
    scale = seq_len / max_position_embeddings
    mscale = get_mscale(scale)
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2).double() / dim))
    chunk_len = chunk_size - local_window
    q_t = torch.arange(chunk_len, dtype=inv_freq.dtype)
    qc_t = (torch.arange(chunk_len, dtype=inv_freq.dtype) + chunk_len).clamp(max=chunk_size)
    k_t = torch.arange(seq_len + 512, dtype=inv_freq.dtype) % chunk_len
    caches = []
    for t in (q_t, qc_t, k_t):
        freqs = torch.outer(t, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        caches += [emb.cos() * mscale, emb.sin() * mscale]
    return caches  # q_cos, q_sin, qc_cos, qc_sin, k_cos, k_sin


def apply_rotary_pos_emb_chunk(x, cos, sin, position_ids):  # l. 86-93
    cos = cos[position_ids].unsqueeze(1)
    sin = sin[position_ids].unsqueeze(1)
    return (x * cos) + (rotate_half(x) * sin)


def merge_attn_outputs(flash_results, weights_dtype):  # l. 96-111 (weights_dtype: torch.bfloat16 in the original)
    attn_outputs_all = [flash_results[0][0]]
    flash_results = flash_results[1:]
    for flash_per_chunk in flash_results:
        attn_outputs = torch.stack([flash_attn_output[0] for flash_attn_output in flash_per_chunk])
        logits = torch.stack([flash_attn_output[1] for flash_attn_output in flash_per_chunk]).to(torch.float64)
        max_logits = torch.max(logits, dim=0).values
        stable_logits = logits - max_logits.unsqueeze(0)
        lse_s = torch.exp(stable_logits)
        lse_sum = torch.sum(lse_s, dim=0)
        lse_s /= lse_sum
        lse_s = lse_s.to(weights_dtype).double()
        attn_outputs = attn_outputs * lse_s.unsqueeze(-1)
        attn_outputs_all.append(attn_outputs.sum(dim=0))
    return torch.cat(attn_outputs_all, dim=2)


def do_flash_attn(query_states, key_states, value_states, causal=True):  # l. 114-118
    output, softmax_lse = flash_attn_emulated(
        query_states.transpose(1, 2), key_states.transpose(1, 2), value_states.transpose(1, 2), causal=causal
    )
    return output.transpose(1, 2), softmax_lse


def chunkllama_forward(q, k, v, position_ids, past, trained, chunk_size, local_window, weights_dtype=torch.float64):
    """forward (l. 121-241) from the projections' q (B, H, Tq, D), k and v (B, Hk, Tq, D) to the attention output
    (B, H, Tq, D); `past`: the cached (rotated) keys and values, or None. Returns the output and the new cache."""
    chunk_len = chunk_size - local_window
    q_len = q.shape[2]
    kv_seq_len = q_len + (past[0].shape[2] if past is not None else 0)
    has_kv_cache = q_len != kv_seq_len
    q_cos, q_sin, qc_cos, qc_sin, k_cos, k_sin = chunkllama_caches(
        max(kv_seq_len, trained), trained, q.shape[-1], chunk_size, local_window
    )
    key_states = apply_rotary_pos_emb_chunk(k.double(), k_cos, k_sin, position_ids)
    position_ids = position_ids % chunk_len
    value_states = v.double()
    if past is not None:
        key_states, value_states = torch.cat((past[0], key_states), 2), torch.cat((past[1], value_states), 2)
    cache = (key_states, value_states)
    key_states = repeat_kv(key_states, H // HKV)
    value_states = repeat_kv(value_states, H // HKV)
    query_states = q.double()
    flash_results = []
    if not has_kv_cache:
        q_states_intra = apply_rotary_pos_emb_chunk(
            query_states[:, :, :chunk_len, :], q_cos, q_sin, position_ids[:, :chunk_len]
        )
        k_states_prev = key_states[:, :, :chunk_len, :]
        v_states_prev = value_states[:, :, :chunk_len, :]
        flash_results.append(do_flash_attn(q_states_intra, k_states_prev, v_states_prev))
        remain_len = kv_seq_len - chunk_len
        while remain_len > 0:
            flash_per_chunk = []
            begin = kv_seq_len - remain_len
            curr_chunk_len = min(chunk_len, remain_len)
            end = begin + curr_chunk_len
            q_states_intra = apply_rotary_pos_emb_chunk(
                query_states[:, :, begin:end, :], q_cos, q_sin, position_ids[:, begin:end]
            )
            k_states_intra = key_states[:, :, begin:end, :]
            v_states_intra = value_states[:, :, begin:end, :]
            flash_per_chunk.append(do_flash_attn(q_states_intra, k_states_intra, v_states_intra))
            q_states_succ = apply_rotary_pos_emb_chunk(
                query_states[:, :, begin:end, :], qc_cos, qc_sin, position_ids[:, begin:end]
            )
            flash_per_chunk.append(do_flash_attn(q_states_succ, k_states_prev, v_states_prev, False))
            if begin - (k_states_prev.size(-2)) > 0:
                prev_len = k_states_prev.size(-2)
                q_states_inter = apply_rotary_pos_emb_chunk(
                    query_states[:, :, begin:end, :],
                    qc_cos,
                    qc_sin,
                    position_ids[:, chunk_len - 1][:, None].repeat(1, curr_chunk_len),
                )
                k_states_inter = key_states[:, :, : begin - prev_len, :]
                v_states_inter = value_states[:, :, : begin - prev_len, :]
                flash_per_chunk.append(do_flash_attn(q_states_inter, k_states_inter, v_states_inter, False))
            flash_results.append(flash_per_chunk)
            k_states_prev = k_states_intra
            v_states_prev = v_states_intra
            remain_len = remain_len - chunk_len
        return merge_attn_outputs(flash_results, weights_dtype), cache
    chunk_num_curr = (kv_seq_len - 1) // chunk_len
    q_states_intra = apply_rotary_pos_emb_chunk(query_states, q_cos, q_sin, position_ids)
    k_states_intra = key_states[:, :, chunk_len * chunk_num_curr : kv_seq_len, :]
    attn_weights = torch.matmul(q_states_intra, k_states_intra.transpose(2, 3)) / math.sqrt(D)
    attn_scores = [attn_weights]
    if chunk_num_curr >= 1:
        q_states_succ = apply_rotary_pos_emb_chunk(query_states, qc_cos, qc_sin, position_ids)
        k_states_succ = key_states[:, :, chunk_len * (chunk_num_curr - 1) : chunk_len * chunk_num_curr, :]
        attn_weights = torch.matmul(q_states_succ, k_states_succ.transpose(2, 3)) / math.sqrt(D)
        attn_scores = [attn_weights] + attn_scores
    if chunk_num_curr >= 2:
        q_states_inter = apply_rotary_pos_emb_chunk(query_states, qc_cos, qc_sin, torch.tensor([[chunk_len - 1]]))
        k_states_inter = key_states[:, :, : chunk_len * (chunk_num_curr - 1), :]
        attn_weights = torch.matmul(q_states_inter, k_states_inter.transpose(2, 3)) / math.sqrt(D)
        attn_scores = [attn_weights] + attn_scores
    attn_weights = torch.cat(attn_scores, dim=-1)
    attn_weights = torch.softmax(attn_weights, dim=-1)
    return torch.matmul(attn_weights, value_states), cache


# ===================================================================================================================
# STRING (string_for_llama.py)


def string_cos_sin(seq_len, dim, attention_factor, base=10000.0):  # RotaryEmbedding._set_cos_sin_cache, l. 302-309
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2).double() / dim))
    freqs = torch.outer(torch.arange(seq_len, dtype=inv_freq.dtype), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return attention_factor * emb.cos(), attention_factor * emb.sin()


def string_flash_forward(neighbor_query_states, shifted_query_states, key_states, value_states, diag_size):
    """l. 323-367 (tensors (B, T, H, D) as flash-attn takes them)."""
    kv_seq_len = neighbor_query_states.size(1)
    diag_out, diag_lse = flash_attn_emulated(
        neighbor_query_states, key_states, value_states, causal=True, window=(diag_size, 0)
    )
    triangle_len = kv_seq_len - diag_size
    if triangle_len < 0:
        return diag_out
    shifted_out, shifted_lse = flash_attn_emulated(
        shifted_query_states[:, -triangle_len:, :, :],
        key_states[:, :triangle_len, :, :],
        value_states[:, :triangle_len, :, :],
        causal=True,
    )
    L = diag_out.size(1)
    N = shifted_out.size(1)
    S = L - N
    diag_lse_tail = diag_lse[:, :, S:]
    diag_out_head = diag_out[:, :S]
    diag_out_tail = diag_out[:, S:]
    lse_gap = 1 / (1 + torch.exp(diag_lse_tail - shifted_lse))
    lse_gap_re = 1 / (1 + torch.exp(shifted_lse - diag_lse_tail))
    lse_gap = lse_gap.transpose(1, 2).unsqueeze(-1)
    lse_gap_re = lse_gap_re.transpose(1, 2).unsqueeze(-1)
    merge_out_tail = diag_out_tail * lse_gap_re + shifted_out * lse_gap
    return torch.cat([diag_out_head, merge_out_tail], dim=1)


def string_forward(q, k, v, position_ids, past, diag_size, local_window):
    """forward (l. 370-444) from the projections' q, k, v (B, H or Hk, Tq, D) to the attention output (B, Tq, H, D);
    `past`: the cached (rotated) keys and values (B, T, Hk, D) or None. Returns the output and the new cache."""
    attention_factor = 0.1 * math.log(2) + 1  # l. 739
    q_len = q.shape[2]
    kv_seq_len = q_len + (past[0].shape[1] if past is not None else 0)
    has_kv_cache = q_len != kv_seq_len
    cos, sin = string_cos_sin(kv_seq_len + 1024, q.shape[-1], attention_factor)
    key_states = apply_rotary_pos_emb_chunk(k.double(), cos, sin, position_ids).transpose(1, 2)
    value_states = v.double().transpose(1, 2)
    if past is not None:
        key_states, value_states = torch.cat((past[0], key_states), 1), torch.cat((past[1], value_states), 1)
    cache = (key_states, value_states)
    query_states_1 = apply_rotary_pos_emb_chunk(q.double(), cos, sin, position_ids)
    shifted_ids = position_ids - diag_size + local_window
    query_states_2 = apply_rotary_pos_emb_chunk(q.double(), cos, sin, shifted_ids.clamp(min=0))  # rows < S unused
    if not has_kv_cache:
        return string_flash_forward(
            query_states_1.transpose(1, 2), query_states_2.transpose(1, 2), key_states, value_states, diag_size
        ), cache
    shifted_size = kv_seq_len - diag_size  # flash decoding: the last S keys at true positions, the rest shifted
    out1, lse1 = flash_attn_emulated(
        query_states_1.transpose(1, 2), key_states[:, shifted_size:kv_seq_len], value_states[:, shifted_size:kv_seq_len]
    )
    out2, lse2 = flash_attn_emulated(
        query_states_2.transpose(1, 2), key_states[:, :shifted_size], value_states[:, :shifted_size]
    )
    gap21 = 1 / (1 + torch.exp(lse2 - lse1))
    gap12 = 1 / (1 + torch.exp(lse1 - lse2))
    return out1 * gap21.transpose(1, 2)[..., None] + out2 * gap12.transpose(1, 2)[..., None], cache


# ===================================================================================================================
# ctxeval


def ctxeval_attention(q, k, v, q_pos, k_pos, spec, trained, fused):
    """What a patched model runs: q, k rotated at true positions by RoPE, then ctxeval. Returns (B, Tq, H, D)."""
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, D, 2).double() / D))
    query = rotate(q.double(), q_pos[None].expand(q.shape[0], -1), inv_freq).float()
    key = rotate(k.double(), k_pos[None].expand(k.shape[0], -1), inv_freq).float()
    fn = fused_shifted if fused else attend_shifted
    return fn(
        query, key, v.float(), q_pos[None], k_pos[None], None, D**-0.5, inv_freq.float(), (spec,), trained
    ).double()


CASES = [  # (method, params, trained length, total tokens): lengths no chunk divides, temperature on and off
    ("dca", {"chunk_size": 30, "local_size": 7}, 40, 83),  # c = 23: four chunks, n > L: temperature 1.037
    ("dca", {"chunk_size": 30, "local_size": 16}, 40, 71),  # c = 14: inter query at 2c - 1 = 27 < chunk_size
    ("dca", {}, 64, 151),  # ChunkLlama's defaults: chunk 48, local 8, c = 40
    ("dca", {"chunk_size": 21, "local_size": 5}, 200, 77),  # below the trained length: no temperature
    ("string", {"shift": 29, "local": 6}, 64, 77),
    ("string", {"local": 16}, 96, 101),  # STRING's default shift int(0.33 L) = 31 (its W = 128 > S is refused)
]


def qkv(seed, total):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, H, total, D, generator=gen, dtype=torch.float64)
    k = torch.randn(2, HKV, total, D, generator=gen, dtype=torch.float64)
    v = torch.randn(2, HKV, total, D, generator=gen, dtype=torch.float64)
    return q, k, v


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[2]}-{c[3]}")
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "chunked"])
def test_prefill_equals_the_original(case, fused):
    name, params, trained, total = case
    spec = resolve_attention(name, params)
    for seed in SEEDS:
        q, k, v = qkv(seed, total)
        pos = torch.arange(total)
        if name == "dca":
            chunk = params.get("chunk_size", trained * 3 // 4)
            local = params.get("local_size", trained // 8)
            want, _ = chunkllama_forward(q, k, v, pos[None].expand(2, -1), None, trained, chunk, local)
            want = want.transpose(1, 2)
        else:
            shift = params.get("shift", int(0.33 * trained))
            want, _ = string_forward(q, k, v, pos[None].expand(2, -1), None, shift, params["local"])
        got = ctxeval_attention(q, k, v, pos, pos, spec, trained, fused)
        assert (got - want).abs().max() < ATOL


@pytest.mark.parametrize("case", [c for c in CASES if c[0] == "string" or c[3] < c[2]], ids=lambda c: c[0])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "chunked"])
def test_a_decoding_step_equals_the_original(case, fused):
    """One token after a prefill, against the original's cached keys and decoding branch."""
    name, params, trained, total = case
    spec = resolve_attention(name, params)
    q, k, v = qkv(5, total + 1)
    pos = torch.arange(total + 1)
    if name == "dca":
        chunk, local = params["chunk_size"], params["local_size"]
        _, past = chunkllama_forward(
            q[:, :, :total],
            k[:, :, :total],
            v[:, :, :total],
            pos[None, :total].expand(2, -1),
            None,
            trained,
            chunk,
            local,
        )
        want, _ = chunkllama_forward(
            q[:, :, total:],
            k[:, :, total:],
            v[:, :, total:],
            pos[None, total:].expand(2, -1),
            past,
            trained,
            chunk,
            local,
        )
        want = want.transpose(1, 2)
    else:
        shift = params.get("shift", int(0.33 * trained))
        args = (shift, params["local"])
        _, past = string_forward(
            q[:, :, :total], k[:, :, :total], v[:, :, :total], pos[None, :total].expand(2, -1), None, *args
        )
        want, _ = string_forward(
            q[:, :, total:], k[:, :, total:], v[:, :, total:], pos[None, total:].expand(2, -1), past, *args
        )
    got = ctxeval_attention(q[:, :, total:], k, v, pos[total:], pos, spec, trained, fused)
    assert (got - want).abs().max() < ATOL


def test_chunkllamas_bfloat16_merge_weights_are_the_only_prefill_difference():
    """The original rounds the merge weights to bfloat16 (l. 107): ctxeval (float32 merge) differs from it by about
    that rounding and no more, and from the float64-weight transcription by < 1e-5 (the test above)."""
    spec = resolve_attention("dca", {"chunk_size": 30, "local_size": 7})
    q, k, v = qkv(0, 83)
    pos = torch.arange(83)
    literal, _ = chunkllama_forward(q, k, v, pos[None].expand(2, -1), None, 40, 30, 7, weights_dtype=torch.bfloat16)
    got = ctxeval_attention(q, k, v, pos, pos, spec, 40, True)
    gap = float((got - literal.transpose(1, 2)).abs().max())
    assert 1e-5 < gap < 2e-2
