"""Dual Chunk Attention and STRING: attention methods that score each (query, key) pair under one of several
position rules, chosen by where the pair lies, all in one softmax.

  dca      An et al. 2024, "Training-Free Long-Context Scaling of Large Language Models" (HKUNLP/ChunkLlama,
           chunkllama_attn_replace.py). With c = chunk_size - local_size, every key sits at j mod c, and query i at
             intra        i mod c                      for keys in its own chunk (j // c == i // c): true distance;
             successive   min(i mod c + c, chunk_size) for keys in the chunk before it: true distance up to the
                                                       local window, then clamped;
             inter        min(2c - 1, chunk_size)      for keys two or more chunks back (ChunkLlama's q_inter is
                                                       qc at index c - 1).
           Temperature past the trained length L at sequence length n (`scale`): chunkllama, the original's
           get_mscale, 0.05 ln(n/L) + 1 on cos and sin of q and of k (logits x its square on the rotary dims);
           vllm, vLLM's DualChunkFlashAttention (Qwen2.5-1M, Qwen3-2507), max(1, 0.1 ln(n/original) + 1) on the
           key and on the softmax scale (every logit x its square); none.
  string   An et al. 2025, "Why Does the Effective Context Length of LLMs Fall Short?" (HKUNLP/STRING,
           string_for_llama.py): with shift S and local W, a sliding-window part at true positions over keys at
           distance d <= S, and a shifted part, query at i - S + W, over keys at d >= S: the key at exactly S is in
           both (string_flash_forward's window_size=[S, 0] and its causal triangle), in a prefill. A decoding step
           (the reference's flash-decoding branch) takes d < S and d >= S: that key once. cos and sin are multiplied by
           attention_factor (0.1 ln 2 + 1) for every pair.
Queries and keys arrive rotated at their true positions; each rule is applied by rotating them on by the difference
(methods.rotate). A rule that moves q and k alike (DCA's intra) leaves the pair as it is and needs no rotation.

Paths, as for the other remapping methods (kernels.py): `attend_shifted` is the exact chunked reference, float32
score maps of a chunk of queries against every key under each rule; `fused_shifted` runs DCA as ChunkLlama does,
three attention calls per chunk of queries (a causal square of its own chunk, the previous chunk in full, the keys
before it in full) merged by their log-sum-exps, and STRING as kernels.fused_rows' near band and shifted far part
with the band one key wider. `reference_shifted` is the row-by-row float64 formula the probe checks against.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from .kernels import FarKeyCache, MaskVerdicts, attention_with_lse, fused_rows, merge_into, scale_queries
from .methods import (
    SCORE_BUDGET_BYTES,
    AttentionSpec,
    dca_scale_length,
    dca_sizes,
    logn_scale,
    rotate,
    specs_logn_length,
    string_sizes,
)

if TYPE_CHECKING:
    import torch

SHIFTED_METHODS = ("dca", "string")
Rule = Callable[[Any, Any], Any]  # (query positions (B, c, 1), key positions (B, 1, Tk)) -> bool (B, c, Tk)


def shifted_spec(specs: tuple[AttentionSpec, ...]) -> AttentionSpec | None:
    return next((s for s in specs if s.name in SHIFTED_METHODS), None)


def sizes_of(spec: AttentionSpec, original_length: int) -> tuple[int, int]:
    """(chunk_size, local_size) for dca, (shift, local) for string."""
    return dca_sizes(spec, original_length) if spec.name == "dca" else string_sizes(spec, original_length)


def gains(spec: AttentionSpec, lengths: torch.Tensor, original_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per batch row of sequence length n (B,): the factor on the rotary dims of q and of k each (the references'
    factor on cos and sin) and the factor on every logit. Both (B,) float64."""
    import torch

    n = lengths.to(torch.float64)
    one = torch.ones_like(n)
    if spec.name == "string":
        return one * spec.params["attention_factor"], one
    scale_from = dca_scale_length(spec, original_length)
    if scale_from is None:
        return one, one
    if spec.params.get("scale", "chunkllama") == "chunkllama":
        return torch.where(n > scale_from, 0.05 * torch.log(n / scale_from) + 1, one), one
    factor = (0.1 * torch.log(n / scale_from) + 1).clamp(min=1.0)
    return one, factor * factor


def scale_rotary(x: torch.Tensor, factor: torch.Tensor, rotary_dim: int) -> torch.Tensor:
    """x (B, H, T, D) with its first `rotary_dim` dims times factor (B,) (the dims RoPE rotates)."""
    import torch

    gain = factor.to(x.dtype).view(-1, *([1] * (x.dim() - 1)))
    return torch.cat((x[..., :rotary_dim] * gain, x[..., rotary_dim:]), dim=-1)


def rules(
    spec: AttentionSpec, sizes: tuple[int, int], q_pos: torch.Tensor, k_pos: torch.Tensor, prefill: bool
) -> list[tuple[torch.Tensor, torch.Tensor, Rule]]:
    """Per rule: the positions it gives the queries (B, Tq) and the keys (B, Tk), and which pairs it scores."""
    import torch

    if spec.name == "dca":
        chunk, local = sizes
        c = chunk - local
        k_new = k_pos % c
        return [
            (q_pos % c, k_new, lambda qi, kj: qi // c == kj // c),
            ((q_pos % c + c).clamp(max=chunk), k_new, lambda qi, kj: kj // c == qi // c - 1),
            (torch.full_like(q_pos, min(2 * c - 1, chunk)), k_new, lambda qi, kj: kj // c <= qi // c - 2),
        ]
    shift, local = sizes
    near: Rule = (lambda qi, kj: qi - kj <= shift) if prefill else (lambda qi, kj: qi - kj < shift)
    return [(q_pos, k_pos, near), (q_pos - shift + local, k_pos, lambda qi, kj: qi - kj >= shift)]


def attend_shifted(
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
    """methods.attend's contract (same arguments, (B, Tq, Hq, D) out) for dca and string: the exact reference."""
    import torch

    spec = shifted_spec(specs)
    batch, heads, tq, dim = query.shape
    kv_heads, tk = key.shape[1], key.shape[2]
    q_pos, k_pos = q_pos.expand(batch, tq), k_pos.expand(batch, tk)
    groups, rotary_dim = heads // kv_heads, 2 * inv_freq.numel()
    logn = specs_logn_length(specs, original_length)
    rotary, logit = gains(spec, k_pos[:, -1] + 1, original_length)
    parts = rules(spec, sizes_of(spec, original_length), q_pos, k_pos, prefill=tq == tk)
    kf = scale_rotary(key.float(), rotary, rotary_dim)  # (B, Hk, Tk, D)
    keys = [rotate(kf, k_new - k_pos, inv_freq) for _, k_new, _ in parts]
    vf = value.float()
    if chunk is None:
        chunk = max(1, SCORE_BUDGET_BYTES // (batch * heads * max(tk, 1) * 4 * (len(parts) + 1)))
    out = torch.empty(batch, tq, heads, dim, dtype=query.dtype, device=query.device)
    offset, floor = tk - tq, torch.finfo(torch.float32).min
    logit_scale = (scaling * logit).float().view(batch, 1, 1, 1, 1)
    for start in range(0, tq, chunk):
        rows = slice(start, min(tq, start + chunk))
        n = rows.stop - rows.start
        q = scale_rotary(query[:, :, rows].float(), rotary, rotary_dim)
        if logn is not None:
            q = q * logn_scale(q_pos[:, rows], logn).float()[:, None, :, None]
        q = q.reshape(batch, kv_heads, groups, n, dim)  # (B, Hk, g, c, D)
        if mask is None:
            allowed = (
                torch.arange(tk, device=query.device)[None]
                <= (offset + torch.arange(rows.start, rows.stop, device=query.device))[:, None]
            )
            allowed, additive = allowed[None, None, None], None  # (1, 1, 1, c, Tk)
        elif mask.dtype == torch.bool:
            allowed, additive = mask[:, :, rows][:, :, None], None
        else:
            allowed, additive = None, mask[:, :, rows][:, :, None].float()
        scores = []
        for (q_new, _, rule), k_rule in zip(parts, keys):
            turned = rotate(q, (q_new - q_pos)[:, rows], inv_freq)
            part = torch.matmul(turned, k_rule[:, :, None].transpose(-1, -2)) * logit_scale  # (B, Hk, g, c, Tk)
            keep = rule(q_pos[:, rows, None], k_pos[:, None, :])[:, None, None]  # (B, 1, 1, c, Tk)
            part = part.masked_fill(~keep, floor)
            part = part.masked_fill(~allowed, floor) if allowed is not None else part + additive
            scores.append(part)
        probs = torch.softmax(torch.cat(scores, dim=-1), dim=-1)
        context = sum(
            torch.matmul(probs[..., r * tk : (r + 1) * tk], vf[:, :, None]) for r in range(len(parts))
        )  # (B, Hk, g, c, D)
        out[:, rows] = context.reshape(batch, heads, n, dim).transpose(1, 2).to(query.dtype)
    return out


def reference_shifted(
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
    """methods.reference_attention's contract for dca and string (pre-RoPE q (H, Tq, D), k and v (H, Tk, D), one
    query row at a time in float64, q and k rotated to each rule's positions). Returns (Tq, H, D)."""
    import torch

    spec = shifted_spec(specs)
    logn = specs_logn_length(specs, original_length)
    rotary, logit = gains(spec, k_pos[-1:] + 1, original_length)
    rotary_dim = 2 * inv_freq.numel()
    k_scaled = scale_rotary(k_raw.double()[None], rotary, rotary_dim)[0]
    parts = rules(spec, sizes_of(spec, original_length), q_pos[None], k_pos[None], prefill=len(q_pos) == len(k_pos))
    rows = []
    for i in range(len(q_pos)):
        q = scale_rotary(q_raw[:, i : i + 1].double()[None], rotary, rotary_dim)[0]  # (H, 1, D)
        if logn is not None:
            q = q * float(logn_scale(q_pos[i : i + 1], logn)[0])
        scores, values = [], []
        for q_new, k_new, rule in parts:
            turned = rotate(q[None], q_new[:, i : i + 1], inv_freq)[0]  # (H, 1, D)
            keys = rotate(k_scaled[None], k_new, inv_freq)[0]  # (H, Tk, D)
            score = (turned * keys).sum(-1) * scaling * float(logit[0])  # (H, Tk)
            keep = rule(q_pos[i].view(1, 1, 1), k_pos.view(1, 1, -1))[0, 0] & (k_pos <= q_pos[i])
            scores.append(score.masked_fill(~keep[None], float("-inf")))
            values.append(value.double())
        probs = torch.softmax(torch.cat(scores, dim=-1), dim=-1)  # (H, rules x Tk)
        rows.append((probs[:, None] @ torch.cat(values, dim=1))[:, 0])  # (H, D)
    return torch.stack(rows)


# ---------------------------------------------------------------------------------------------------------------
# the fused path


def causal_tail(
    q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention of queries that are the last Tq of Tk keys: a full block of the keys before the first query
    and a causal square. Returns (B, H, Tq, D) float32 and its log-sum-exp (B, H, Tq)."""
    tq, tk = q.shape[2], key.shape[2]
    out, lse = attention_with_lse(q, key[:, :, tk - tq :], value[:, :, tk - tq :], scaling, causal=tq > 1)
    out = out.float()
    if tk > tq:
        merge_into(out, lse, *attention_with_lse(q, key[:, :, : tk - tq], value[:, :, : tk - tq], scaling))
    return out, lse


def dca_rows(
    q: torch.Tensor,
    key: torch.Tensor,
    far_keys: torch.Tensor,
    value: torch.Tensor,
    sizes: tuple[int, int],
    scaling: float,
    inv_freq: torch.Tensor,
) -> torch.Tensor:
    """DCA for queries that are the last Tq of Tk keys whose positions are their indices. q (B, H, Tq, D) at true
    positions (rotary part already scaled), key and value (B, Hk, Tk, D), far_keys: key rotated to j mod c.
    Returns (B, H, Tq, D) float32."""
    import torch

    chunk, local = sizes
    c = chunk - local
    batch, heads, tq, dim = q.shape
    tk = key.shape[2]
    offset = tk - tq
    out = torch.empty(batch, heads, tq, dim, dtype=torch.float32, device=q.device)
    for n in range(offset // c, (tk - 1) // c + 1):
        first, stop = max(n * c, offset), min((n + 1) * c, tk)  # the chunk's query positions
        rows = slice(first - offset, stop - offset)
        block = q[:, :, rows]
        part, lse = causal_tail(block, key[:, :, n * c : stop], value[:, :, n * c : stop], scaling)
        positions = torch.arange(first, stop, device=q.device)
        if n >= 1:  # the previous chunk: query at min(i mod c + c, chunk_size), i.e. n c + local at most
            delta = (positions.clamp(max=n * c + local) - positions)[None].expand(batch, -1)
            prev = slice((n - 1) * c, n * c)
            merge_into(
                part,
                lse,
                *attention_with_lse(rotate(block, delta, inv_freq), key[:, :, prev], value[:, :, prev], scaling),
            )
        if n >= 2:  # every earlier chunk: query at min(2c - 1, chunk_size), keys at j mod c
            delta = (min(2 * c - 1, chunk) - positions)[None].expand(batch, -1)
            early = slice(0, (n - 1) * c)
            merge_into(
                part,
                lse,
                *attention_with_lse(rotate(block, delta, inv_freq), far_keys[:, :, early], value[:, :, early], scaling),
            )
        out[:, :, rows] = part
    return out


def fused_shifted(
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
    module: Any = None,
    cache: FarKeyCache | None = None,
    verdicts: MaskVerdicts | None = None,
) -> torch.Tensor:
    """attend_shifted's result on the fused kernels; masks other than causal-with-left-padding, and positions that
    do not start at 0 on the first real key, go to attend_shifted itself."""
    import torch

    batch, heads, tq, dim = query.shape
    tk = key.shape[2]
    q_pos, k_pos = q_pos.expand(batch, tq), k_pos.expand(batch, tk)
    starts = (verdicts or MaskVerdicts()).starts(mask, tq, tk)
    if starts is None or any(int(k_pos[b, s]) != 0 for b, s in enumerate(starts * (batch // len(starts)))):
        return attend_shifted(query, key, value, q_pos, k_pos, mask, scaling, inv_freq, specs, original_length)
    spec = shifted_spec(specs)
    sizes = sizes_of(spec, original_length)
    logn = specs_logn_length(specs, original_length)
    q = scale_queries(query, q_pos, logn) if logn is not None else query
    rotary, logit = gains(spec, k_pos[:, -1] + 1, original_length)
    q = scale_rotary(q, rotary * rotary, 2 * inv_freq.numel())  # q.k's rotary part x rotary^2: keys stay as cached
    far_keys = None
    if spec.name == "dca":
        c = sizes[0] - sizes[1]
        delta = k_pos % c - k_pos
        far_keys = (
            cache.far_keys(module, key, delta, inv_freq, tq) if cache is not None else rotate(key, delta, inv_freq)
        )
    offset = tk - tq

    def rows_of(b: slice, first: int, start: int) -> torch.Tensor:
        scale = scaling * float(logit[b.start])
        if spec.name == "dca":
            return dca_rows(
                q[b, :, first:], key[b, :, start:], far_keys[b, :, start:], value[b, :, start:], sizes, scale, inv_freq
            )
        shift, local = sizes
        q_far = rotate(q[b, :, first:], torch.full_like(q_pos[b, first:], local - shift), inv_freq)
        near = shift + 1 if tq == tk else shift  # the key at exactly S: in both parts in a prefill (module doc)
        keys = key[b, :, start:]
        return fused_rows(q[b, :, first:], q_far, keys, keys, value[b, :, start:], shift, scale, near=near)

    if len(set(starts)) == 1 and starts[0] == 0 and bool((logit == logit[0]).all()):
        out = rows_of(slice(0, batch), 0, 0)
    else:
        out = torch.zeros(batch, heads, tq, dim, dtype=torch.float32, device=query.device)
        for b, start in enumerate(starts * (batch // len(starts))):
            first = max(0, start - offset)  # the first real query row
            out[b : b + 1, :, first:] = rows_of(slice(b, b + 1), first, start)
    return out.transpose(1, 2).to(query.dtype)


def probe_length(spec: AttentionSpec, original_length: int, cap: int) -> int:
    """Keys the probe needs for every rule to score some pair (DCA: into a third chunk; STRING: past the shift),
    at most `cap`."""
    chunk, local = sizes_of(spec, original_length)
    needed = 2 * (chunk - local) + 48 if spec.name == "dca" else chunk + 48
    return min(needed, cap)


def rules_probed(spec: AttentionSpec, original_length: int, total: int) -> list[str]:
    """The rules a probe over `total` keys exercised."""
    chunk, local = sizes_of(spec, original_length)
    if spec.name == "string":
        return ["near"] + (["shifted"] if total > chunk else [])
    c = chunk - local
    return ["intra"] + (["successive"] if total > c else []) + (["inter"] if total > 2 * c else [])
