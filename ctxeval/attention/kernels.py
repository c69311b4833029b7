"""Fast paths for the attention methods of methods.py, on the attention kernels torch already has; the
exact chunked loop there (`attend`) stays the reference they are tested against and the fallback.

Which path runs is decided in one place, `choose_kernel`, and recorded in run.json (`attention_kernel`):
  query-scale  log-n alone: a static per-position factor on q, then the model's own attention function (sdpa,
               eager or flash-attention 2) unchanged. It never leaves the fused kernel.
  fused        Self-Extend, ReRoPE, leaky ReRoPE (with or without log-n): the one softmax over two score maps
               written as attention calls that return their log-sum-exp, merged exactly by it:
                 near   query i with the keys j in (i - W, i], at RoPE's true positions: blocks of `NEAR_BLOCK`
                        queries against their band of W + block - 1 keys, with a band mask;
                 far    query i rotated to its far position with the keys j <= i - W rotated to theirs: a causal
                        attention shifted by W (bottom-right aligned: a full block of keys every row sees, then an
                        is_causal square), so the kernel skips the masked half as plain causal attention does.
               Kernels: torch's flash attention for CPU (aten::_scaled_dot_product_flash_attention_for_cpu, which
               returns the log-sum-exp and takes grouped-query heads as they are), and on CUDA torch's memory-
               efficient attention (aten::_scaled_dot_product_efficient_attention with compute_log_sumexp).
               The work is that of causal attention over L - W keys plus a band of W + block keys per query:
               about the cost of the model's own sdpa, O(block x (W + block)) memory per head, never L x L.
  chunked      attention_methods.attend, the exact reference: float32 score maps of a chunk of queries against
               every key. CTXEVAL_ATTENTION_KERNEL=chunked forces it (to compare, or to reproduce older runs); 'auto' or
               unset chooses as above, and any other value is refused in one line.
Decoding: a far key's rotation depends only on its own position (Self-Extend's j // G, ReRoPE's unrotated key), so
`FarKeyCache` keeps each layer's far keys across generation steps; a step rotates only the new keys and reads the
cache twice (near band and far keys), where the reference re-rotates every cached key of every layer.
Padding: a causal mask with left padding (what transformers' generate builds for a batch) is recognised and each
row's real tokens are attended alone; any other mask goes to the chunked reference (same numbers, slower).
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import CtxevalError
from .methods import attend, far_positions, get_attention_method, logn_scale, rotate, specs_logn_length, window_of
from .temperature import is_query_scale

if TYPE_CHECKING:
    import torch

NEAR_BLOCK = 256  # queries per near-band kernel call: the band is W + NEAR_BLOCK - 1 keys wide
KERNEL_ENV = "CTXEVAL_ATTENTION_KERNEL"


def remapping_spec(specs: tuple[Any, ...]) -> Any | None:
    return next((s for s in specs if get_attention_method(s.name).remaps), None)


def choose_kernel(specs: tuple[Any, ...], device_type: str) -> str:
    """The path `specs` run on (module docstring): 'query-scale', 'fused' or 'chunked'."""
    forced = os.environ.get(KERNEL_ENV, "").strip()
    if forced not in ("", "auto", "chunked"):
        raise CtxevalError(
            f"{KERNEL_ENV}={forced!r} is not a kernel choice: set it to 'chunked' (the exact reference) "
            "or 'auto', or unset it"
        )
    if forced == "chunked" and not any(is_query_scale(s) for s in specs):  # a query temperature has no other path
        return "chunked"
    if remapping_spec(specs) is None:
        return "query-scale"
    return "fused" if device_type in ("cpu", "cuda") else "chunked"


def scale_queries(query: torch.Tensor, q_pos: torch.Tensor, length: int) -> torch.Tensor:
    """log-n: q times max(1, log(i + 1) / log L) at its position i. query (B, H, T, D), q_pos (B, T)."""
    import torch

    factor = logn_scale(q_pos, length).to(torch.float32)[:, None, :, None]  # (B, 1, T, 1)
    return (query.float() * factor).to(query.dtype)


def workspace_bytes(
    specs: tuple[Any, ...], kernel: str, length: int, heads: int, kv_heads: int, dim: int, element_bytes: int
) -> float:
    """Memory one attention call of `specs` needs on top of the model's own attention at `length` (the --dry-run
    estimate): query-scale a scaled copy of q; fused the scaled and far-rotated queries, the far keys, the float32
    output the near blocks fill and the far parts merge into, the far square's output (float32), the far block's,
    and one band mask; chunked the reference's
    float32 score maps (SCORE_BUDGET_BYTES), its float32 copies of q, k, v and the far keys."""
    from .methods import SCORE_BUDGET_BYTES

    q, k = length * heads * dim, length * kv_heads * dim
    if kernel == "query-scale":
        return q * element_bytes
    if kernel == "fused":
        window = window_of(remapping_spec(specs)) or 0
        return (3 * q + k) * element_bytes + 2 * q * 4 + NEAR_BLOCK * (NEAR_BLOCK + window) * 4
    return SCORE_BUDGET_BYTES + (q + 3 * k) * 4 + q * element_bytes


def far_cache_bytes(
    specs: tuple[Any, ...], kernel: str, length: int, layers: int, kv_heads: int, dim: int, element_bytes: int
) -> float:
    """The far-key cache that fused decoding keeps beside the KV cache: one more key tensor per layer."""
    return layers * kv_heads * dim * length * element_bytes if kernel == "fused" else 0.0


# ---------------------------------------------------------------------------------------------------------------
# kernels that return the log-sum-exp


def attention_with_lse(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scaling: float,
    causal: bool = False,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(scaling q k^T [+ mask]) v and its log-sum-exp per row. query (B, H, Tq, D), key/value (B, Hk, Tk, D)
    (H a multiple of Hk), causal: top-left aligned and only used with Tq == Tk, mask: additive float (Tq, Tk) or
    None. Returns (B, H, Tq, D) in query's dtype and (B, H, Tq) float32."""
    import torch

    if query.device.type == "cpu":
        if mask is not None:
            mask = mask.to(query.dtype)
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, key, value, 0.0, causal, attn_mask=mask, scale=scaling
        )
        return out, lse.float()
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    bias = None
    if mask is not None:  # the kernel wants the bias's last dim padded to a multiple of 16, then viewed back
        tk = mask.shape[-1]
        padded = torch.zeros(*mask.shape[:-1], -(-tk // 16) * 16, dtype=query.dtype, device=query.device)
        padded[..., :tk] = mask
        bias = padded[..., :tk].expand(query.shape[0], query.shape[1], -1, -1)
    out, lse, _, _ = torch.ops.aten._scaled_dot_product_efficient_attention(
        query, key.contiguous(), value.contiguous(), bias, True, 0.0, causal, scale=scaling
    )
    return out, lse[..., : query.shape[2]].float()


# ---------------------------------------------------------------------------------------------------------------
# padding


def key_starts(mask: torch.Tensor | None, tq: int, tk: int) -> list[int] | None:
    """Per batch row, the first real key when `mask` is causal with left padding (or None: causal, no padding);
    None when the mask is anything else. Checked on every real query row (the pad rows' own mask is unread)."""
    import torch

    if mask is None:
        return None if tq > tk else [0]
    if mask.dim() != 4 or mask.shape[1] != 1 or mask.shape[-2:] != (tq, tk):
        return None
    visible = mask if mask.dtype == torch.bool else mask == 0
    if mask.dtype != torch.bool and not bool(((mask == 0) | (mask <= torch.finfo(mask.dtype).min / 2)).all()):
        return None  # an additive bias, not a mask
    offset = tk - tq
    starts = []
    for row in visible[:, 0]:  # (Tq, Tk)
        real = torch.nonzero(row[-1]).flatten()
        if real.numel() == 0:
            return None
        start = int(real[0])
        first = max(0, start - offset)
        keys = torch.arange(tk, device=row.device)
        queries = torch.arange(offset + first, tk, device=row.device)[:, None]
        if not torch.equal(row[first:], (keys[None] >= start) & (keys[None] <= queries)):
            return None
        starts.append(start)
    return starts


class MaskVerdicts:
    """key_starts() per mask tensor, computed once per forward: transformers hands every layer the same mask
    object. A reference to the last mask is held, so that its id cannot be reused while its verdict is kept (and
    its version counter, where it has one: inference tensors have none, and cannot be changed outside inference)."""

    def __init__(self) -> None:
        self.mask: Any = None
        self.version = -1
        self.verdict: list[int] | None = None

    def starts(self, mask: torch.Tensor | None, tq: int, tk: int) -> list[int] | None:
        if mask is None:
            return key_starts(None, tq, tk)
        version = -1 if mask.is_inference() else mask._version
        if mask is not self.mask or version != self.version:
            self.mask, self.version, self.verdict = mask, version, key_starts(mask, tq, tk)
        return self.verdict


# ---------------------------------------------------------------------------------------------------------------
# far keys, cached across decoding steps


@dataclass
class CachedFarKeys:
    far: torch.Tensor  # (B, Hk, capacity, D): far keys of the first `count` keys
    count: int
    last_key: torch.Tensor  # (B, Hk, D): the source key at count - 1, to check the cache continues this sequence


class FarKeyCache:
    """Per attention layer, the far keys of every key seen so far in the current generation. A call whose keys
    are its own queries (a prefill without a cache) starts afresh and stores nothing; a call with earlier keys
    (a decoding step) reuses the stored far keys when the layer's cache holds exactly those earlier keys, for the
    same batch and the same last key, and rotates only the new ones; otherwise it rotates all and stores them."""

    def __init__(self) -> None:
        self.layers: weakref.WeakKeyDictionary[Any, CachedFarKeys] = weakref.WeakKeyDictionary()

    def clear(self) -> None:
        self.layers.clear()

    def far_keys(
        self, module: Any, key: torch.Tensor, delta: torch.Tensor, inv_freq: torch.Tensor, new: int
    ) -> torch.Tensor:
        """Far keys of all of `key` (B, Hk, Tk, D) rotated by `delta` (B, Tk); `new` keys are this call's own."""
        import torch

        tk = key.shape[2]
        earlier = tk - new
        if earlier == 0:
            self.layers.pop(module, None)
            return rotate(key, delta, inv_freq)
        held = self.layers.get(module)
        if (
            held is None
            or held.count != earlier
            or held.far.shape[0] != key.shape[0]
            or held.far.dtype != key.dtype
            or held.far.device != key.device
            or not torch.equal(held.last_key, key[:, :, earlier - 1])
        ):
            far = rotate(key, delta, inv_freq)
            self.layers[module] = CachedFarKeys(far, tk, key[:, :, -1].clone())
            return far
        if held.far.shape[2] < tk:  # grow by doubling: appending costs O(new), not a copy of the whole cache
            grown = torch.empty(
                *held.far.shape[:2],
                max(tk, 2 * held.far.shape[2]),
                held.far.shape[3],
                dtype=held.far.dtype,
                device=held.far.device,
            )
            grown[:, :, : held.count] = held.far[:, :, : held.count]
            held.far = grown
        held.far[:, :, earlier:tk] = rotate(key[:, :, earlier:], delta[:, earlier:], inv_freq)
        held.count, held.last_key = tk, key[:, :, -1].clone()
        return held.far[:, :, :tk]


# ---------------------------------------------------------------------------------------------------------------
# the fused path


def band_mask(rows: int, first_key: int, keys: int, first_query: int, window: int, device: Any) -> torch.Tensor:
    """Additive mask (rows, keys): query at index first_query + r sees key first_key + c when
    0 <= (first_query + r) - (first_key + c) < window."""
    import torch

    distance = (first_query + torch.arange(rows, device=device))[:, None] - (
        first_key + torch.arange(keys, device=device)
    )[None]
    return torch.zeros(rows, keys, device=device).masked_fill((distance < 0) | (distance >= window), float("-inf"))


def merge_into(out: torch.Tensor, lse: torch.Tensor, part: torch.Tensor, part_lse: torch.Tensor) -> None:
    """One softmax over the union of two parts' keys from their outputs and log-sum-exps, in place: `out` (float32,
    B, H, T, D) and `lse` (B, H, T) become the union's, out = w out + w' part with w = exp(lse - logaddexp(lse,
    part_lse)); `part` is overwritten. No temporary of out's size: the fused path's memory stays near
    the model's own attention."""
    import torch

    total = torch.logaddexp(lse, part_lse)
    out.mul_(torch.exp(lse - total)[..., None]).add_(part.float().mul_(torch.exp(part_lse - total)[..., None]))
    lse.copy_(total)


def fused_rows(
    q: torch.Tensor,
    q_far: torch.Tensor,
    key: torch.Tensor,
    far_keys: torch.Tensor,
    value: torch.Tensor,
    window: int,
    scaling: float,
    near: int | None = None,
) -> torch.Tensor:
    """The method's attention for queries that are the last Tq of Tk keys, with no padding: keys at distance d <
    `near` (default: window) at true positions, keys at d >= window at far positions (STRING's near part is one key
    wider than its window). q, q_far (B, H, Tq, D), key, far_keys, value (B, Hk, Tk, D). Returns (B, H, Tq, D)
    float32."""
    import torch

    near = window if near is None else near
    batch, heads, tq, dim = q.shape
    offset = key.shape[2] - tq
    out = torch.empty(batch, heads, tq, dim, dtype=torch.float32, device=q.device)
    lse = torch.empty(batch, heads, tq, dtype=torch.float32, device=q.device)
    for start in range(0, tq, NEAR_BLOCK):
        stop = min(tq, start + NEAR_BLOCK)
        first_key = max(0, offset + start - near + 1)
        band = slice(first_key, offset + stop)
        # a single query (a decoding step) sees its whole band; a block needs the band's mask
        mask = (
            None
            if stop - start == 1
            else band_mask(stop - start, first_key, band.stop - first_key, offset + start, near, q.device)
        )
        out[:, :, start:stop], lse[:, :, start:stop] = attention_with_lse(
            q[:, :, start:stop], key[:, :, band], value[:, :, band], scaling, mask=mask
        )
    first_far = max(0, window - offset)  # query rows with at least one far key (i - j >= W for j = 0)
    if first_far >= tq:
        return out
    rows = tq - first_far
    seen = offset + tq - window  # far keys of the last query: 0 .. seen - 1
    qf = q_far[:, :, first_far:]
    far, far_lse = attention_with_lse(
        qf, far_keys[:, :, seen - rows : seen], value[:, :, seen - rows : seen], scaling, causal=rows > 1
    )  # the square: far row r sees its first r + 1 of these keys
    far = far.float()
    if seen > rows:  # keys every far row sees
        merge_into(
            far, far_lse, *attention_with_lse(qf, far_keys[:, :, : seen - rows], value[:, :, : seen - rows], scaling)
        )
    merge_into(out[:, :, first_far:], lse[:, :, first_far:], far, far_lse)
    return out


def fused_attend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float,
    inv_freq: torch.Tensor,
    specs: tuple[Any, ...],
    original_length: int,
    module: Any = None,
    cache: FarKeyCache | None = None,
    verdicts: MaskVerdicts | None = None,
) -> torch.Tensor:
    """attention_methods.attend's result (same arguments, same (B, Tq, Hq, D) output) on the fused kernels; masks
    other than causal-with-left-padding go to `attend` itself."""
    import torch

    batch, heads, tq, dim = query.shape
    tk = key.shape[2]
    starts = (verdicts or MaskVerdicts()).starts(mask, tq, tk)
    if starts is None:
        return attend(query, key, value, q_pos, k_pos, mask, scaling, inv_freq, specs, original_length)
    remap = remapping_spec(specs)
    logn = specs_logn_length(specs, original_length)
    window = window_of(remap)
    q = scale_queries(query, q_pos, logn) if logn is not None else query
    q_far_pos, k_far_pos = far_positions(remap, q_pos, k_pos)
    q_far = rotate(q, q_far_pos - q_pos, inv_freq)
    delta = k_far_pos - k_pos
    far_keys = cache.far_keys(module, key, delta, inv_freq, tq) if cache is not None else rotate(key, delta, inv_freq)
    offset = tk - tq
    if len(set(starts)) == 1 and starts[0] == 0:
        out = fused_rows(q, q_far, key, far_keys, value, window, scaling)
    else:
        out = torch.zeros(batch, heads, tq, dim, dtype=torch.float32, device=query.device)
        for b, start in enumerate(starts):
            first = max(0, start - offset)  # the first real query row
            out[b : b + 1, :, first:] = fused_rows(
                q[b : b + 1, :, first:],
                q_far[b : b + 1, :, first:],
                key[b : b + 1, :, start:],
                far_keys[b : b + 1, :, start:],
                value[b : b + 1, :, start:],
                window,
                scaling,
            )
    return out.transpose(1, 2).to(query.dtype)
