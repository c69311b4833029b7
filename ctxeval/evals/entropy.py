"""Attention entropy vs. context length: the effect YaRN's temperature exists to correct.

For a query at position i (attending to keys 0..i) the attention entropy is H_i = -sum_j p_ij ln p_ij, at most
ln(i+1) (uniform attention). As the context grows past the trained length, softmax over more keys spreads out and
H rises; YaRN's attention factor sqrt(1/t) = 0.1 ln s + 1 on q and k sharpens the logits and pulls it back.

How it is measured, without a [L x L] map per head:
  - the model runs with transformers' sdpa attention; while `capture()` is active, the registered sdpa function
    is wrapped: for the layers being sampled it recomputes softmax(q k^T * scaling) over chunks of
    `query_chunk` queries (memory: chunk x L per sampled head) and keeps per-query entropies, averaged over the
    sampled heads; then it calls the original sdpa, so the model's output is unchanged. q and k are the tensors
    attention really uses: after RoPE (and YaRN's factor on cos/sin), with the module's scaling (and any
    --attention-temperature) applied.
  - protocol: BOS + the document's first L-1 tokens (the ppl truncate protocol). A causal model's attention at
    query i sees only tokens <= i, so for methods that do not depend on the sequence length one forward at
    max(lengths) gives every shorter length (mean over its first L queries); dynamic methods run once per length.
Mask: causal by position plus the module's attention_mask when it is a tensor (sliding windows, padding); logit
soft-capping (Gemma 2) and attention sinks are not modelled (such modules are refused).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import torch

from ..attention.patching import watch_sdpa
from ..data.corpora import TokenDoc
from ..errors import CtxevalError
from ..models.load import LoadedModel
from ..runs.rows import RESUME_FIELDS, uniform_entropy
from ..runs.store import RunStore
from ..specs import MethodSpec
from .common import PointOOM, Progress, SilentProgress, oom_guard, point_row
from .sweep import document_items, length_dependent, run_items


@dataclass(frozen=True)
class EntropyConfig:
    lengths: tuple[int, ...]
    layers: tuple[int, ...] | None = None  # None: every layer
    heads: tuple[int, ...] | None = None  # None: every query head
    query_chunk: int = 512
    chunk_bytes: int = 2**31  # scores + probabilities of one key/value head's query group per chunk, at most this
    bos: bool = True

    def __post_init__(self) -> None:
        if not self.lengths or min(self.lengths) < 2:
            raise CtxevalError("--lengths must be >= 2 tokens")
        if self.query_chunk < 1:
            raise CtxevalError(f"--query-chunk must be >= 1, got {self.query_chunk}")


class EntropyCapture:
    """Per-query entropies of the sampled layers/heads during one forward: layer -> tensor [positions]."""

    def __init__(
        self, layers: set[int] | None, heads: tuple[int, ...] | None, chunk: int, chunk_bytes: int = 2**31
    ) -> None:
        self.layers, self.heads, self.chunk, self.chunk_bytes = layers, heads, chunk, chunk_bytes
        self.per_layer: dict[int, torch.Tensor] = {}
        self.counter = 0

    def reset(self) -> None:
        self.per_layer, self.counter = {}, 0

    def observe(
        self,
        module: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        mask: Any,
        scaling: float | None,
        kwargs: dict[str, Any],
    ) -> None:
        layer = getattr(module, "layer_idx", None)
        if layer is None:
            layer = self.counter
        self.counter += 1
        if self.layers is not None and layer not in self.layers:
            return
        if kwargs.get("softcap") is not None or getattr(module, "sinks", None) is not None:
            raise CtxevalError(
                "entropy: this model's attention uses logit soft-capping or sinks, which the entropy "
                "measurement does not model"
            )
        # query [B, H, q, D], key [B, Hkv, k, D]
        b, n_heads, n_q, dim = query.shape
        n_k = key.shape[-2]
        if b != 1 or n_q != n_k:
            raise CtxevalError("entropy measures one full-sequence forward at a time (batch 1, no cache)")
        heads = list(self.heads) if self.heads is not None else list(range(n_heads))
        if max(heads) >= n_heads:
            raise CtxevalError(f"--heads {max(heads)} is out of range: the model has {n_heads} query heads")
        group = n_heads // key.shape[1]
        scale = float(scaling) if scaling is not None else dim**-0.5
        by_kv: dict[int, list[int]] = {}  # query heads per key/value head: k is read once per group, never expanded
        for h in heads:
            by_kv.setdefault(h // group, []).append(h)
        total = torch.zeros(n_q, dtype=torch.float64, device=query.device)
        pos_k = torch.arange(n_k, device=query.device)
        for kv_head, members in by_kv.items():
            k = key[0, kv_head].float()  # [k, D]: one head's keys in float32
            q = query[0, members]  # [h_g, q, D], the model's dtype; each chunk goes to float32
            # two float32 [h_g, c, k] tensors live at once (scores, probabilities): the chunk fits the byte budget
            chunk = max(1, min(self.chunk, self.chunk_bytes // (8 * len(members) * n_k)))
            for c0 in range(0, n_q, chunk):
                c1 = min(n_q, c0 + chunk)
                z = torch.einsum("hqd,kd->hqk", q[:, c0:c1].float(), k[:c1]) * scale  # [h_g, c, c1]
                allowed = pos_k[:c1][None, :] <= torch.arange(c0, c1, device=query.device)[:, None]  # [c, c1]
                if isinstance(mask, torch.Tensor):
                    m = mask[0, :, c0:c1, :c1] if mask.dim() == 4 else mask[..., c0:c1, :c1]
                    if m.dtype == torch.bool:
                        allowed = allowed & m.reshape(-1, c1 - c0, c1).all(0)
                    else:
                        z = z + m.float().reshape(-1, c1 - c0, c1)
                z.masked_fill_(~allowed, float("-inf"))
                lse = torch.logsumexp(z, dim=-1, keepdim=True)  # [h_g, c, 1]
                p = z.sub(lse).exp_()  # [h_g, c, c1] softmax; 0 where masked
                z.masked_fill_(p == 0, 0.0)  # masked keys (causal, or an additive -inf mask): 0 * z, not 0 * -inf
                # H = -sum p log p = lse - sum p z
                ent = lse.squeeze(-1) - p.mul_(z).sum(-1)  # [h_g, c]
                total[c0:c1] += ent.sum(0).double()
        out = total / len(heads)
        self.per_layer[int(layer)] = out.cpu()


@contextlib.contextmanager
def capture(model: Any, cfg: EntropyConfig) -> Iterator[EntropyCapture]:
    """Watch the model's sdpa attention while the block runs; yields the capture object."""
    cap = EntropyCapture(
        set(cfg.layers) if cfg.layers is not None else None, cfg.heads, cfg.query_chunk, cfg.chunk_bytes
    )
    with watch_sdpa(model, cap.observe, purpose="entropy"):
        yield cap


class EntropyRunner:
    KEY = RESUME_FIELDS["entropy"]

    def __init__(
        self,
        model: Any,
        device: str,
        cfg: EntropyConfig,
        bos_id: int | None,
        model_name: str,
        progress: Progress | None = None,
    ) -> None:
        self.model, self.device, self.cfg, self.bos_id = model, device, cfg, bos_id
        self.model_name, self.progress = model_name, progress or SilentProgress()

    def _ids(self, doc: TokenDoc, length: int) -> torch.Tensor:
        if self.cfg.bos and self.bos_id is not None:
            ids = [self.bos_id] + doc.ids[: length - 1].tolist()
        else:
            ids = doc.ids[:length].tolist()
        return torch.tensor([ids], device=self.device)

    def _forward(self, cap: EntropyCapture, doc: TokenDoc, length: int) -> dict[int, torch.Tensor]:
        cap.reset()
        body = getattr(self.model, self.model.base_model_prefix, self.model)  # no LM head: no [L x vocab] logits
        with oom_guard(self.device), torch.inference_mode():
            body(input_ids=self._ids(doc, length), use_cache=False)
        if not cap.per_layer:
            raise CtxevalError(
                "entropy: no attention call was seen; this model does not use transformers' attention functions (sdpa)"
            )
        return dict(cap.per_layer)

    def _row(
        self, spec: MethodSpec, doc: TokenDoc, length: int, per_layer: dict[int, torch.Tensor], seconds: float
    ) -> dict[str, Any]:
        layers = sorted(per_layer)
        values = [float(per_layer[layer][:length].mean()) for layer in layers]
        mean = float(np.mean(values))
        return point_row(
            self.model_name,
            spec,
            "entropy",
            value=mean,
            length=length,
            doc=doc.doc_id,
            layers=layers,
            entropy_per_layer=values,
            entropy=mean,
            uniform_entropy=uniform_entropy(length),
            heads=list(self.cfg.heads) if self.cfg.heads else "all",
            seconds=seconds,
            status="ok",
        )

    def measure(
        self, spec: MethodSpec, doc: TokenDoc, lengths: list[int], cap: EntropyCapture, append: Any, static: bool = True
    ) -> None:
        """One forward at max(lengths) for a static method (falls back to one forward per length when it runs out
        of memory, so shorter lengths are still measured); one forward per length otherwise."""
        groups = [sorted(lengths)] if static else [[L] for L in sorted(lengths)]
        forwards_left = len(lengths) + 1  # bound: the whole group, then each length alone; a loop past it is a bug
        while groups:
            forwards_left -= 1
            if forwards_left < 0:
                raise RuntimeError(f"entropy: more forwards than {len(lengths)} lengths need (a bug)")
            group = groups.pop(0)
            top = max(group)
            t0 = time.perf_counter()
            try:
                per_layer = self._forward(cap, doc, top)
            except PointOOM as exc:
                if len(group) > 1:
                    self.progress.note(f"{spec.label}: out of memory at {top} tokens; measuring length by length")
                    groups = [[L] for L in group] + groups
                    continue
                append(
                    [
                        point_row(
                            self.model_name, spec, "entropy", length=L, doc=doc.doc_id, status="oom", note=str(exc)
                        )
                        for L in group
                    ]
                )
                self.progress.note(f"{spec.label}: out of memory at {top} tokens")
                continue
            seconds = time.perf_counter() - t0
            append([self._row(spec, doc, L, per_layer, seconds) for L in group])
            self.progress.advance(top, f"{spec.label} {doc.doc_id} L={top}")


def sweep(
    lm: LoadedModel,
    specs: list[MethodSpec],
    docs: list[TokenDoc],
    cfg: EntropyConfig,
    store: RunStore,
    progress: Progress | None = None,
) -> None:
    """Every (method, length, document) point not yet in `store`, one method applied at a time."""
    progress = progress or SilentProgress()
    runner = EntropyRunner(lm.model, lm.device, cfg, getattr(lm.tokenizer, "bos_token_id", None), lm.name, progress)
    dynamic = {s.label for s in specs if length_dependent(s, lm)}
    items = document_items(
        specs,
        docs,
        cfg.lengths,
        store.done_points(EntropyRunner.KEY),
        per_length=lambda spec: spec.label in dynamic,
        windows=lambda doc: 1,
        tokens=lambda spec, doc, group: sum(group) if spec.label in dynamic else max(group),
    )
    with capture(lm.model, cfg) as cap:
        run_items(
            lm,
            specs,
            items,
            cfg.lengths,
            store,
            progress,
            lambda spec, batch, _handle: runner.measure(
                spec, batch.document, list(batch.lengths), cap, store.append, static=spec.label not in dynamic
            ),
        )


def check_layers(n_layers: int, layers: tuple[int, ...] | None) -> None:
    if layers is not None and (min(layers) < 0 or max(layers) >= n_layers):
        raise CtxevalError(f"--layers must be in 0..{n_layers - 1}, got {','.join(map(str, layers))}")
