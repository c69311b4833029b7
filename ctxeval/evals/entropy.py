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

from ..corpora import TokenDoc
from ..errors import CtxevalError
from ..methods import MethodSpec, get_method
from .perplexity import PointOOM, Progress, _is_oom, _Silent


@dataclass(frozen=True)
class EntropyConfig:
    lengths: tuple[int, ...]
    layers: tuple[int, ...] | None = None  # None: every layer
    heads: tuple[int, ...] | None = None  # None: every query head
    query_chunk: int = 512
    bos: bool = True

    def __post_init__(self) -> None:
        if not self.lengths or min(self.lengths) < 2:
            raise CtxevalError("--lengths must be >= 2 tokens")
        if self.query_chunk < 1:
            raise CtxevalError(f"--query-chunk must be >= 1, got {self.query_chunk}")


def uniform_entropy(length: int) -> float:
    """Mean over queries 0..L-1 of ln(i+1): the entropy of uniform causal attention (the upper bound)."""
    return float(np.mean(np.log(np.arange(1, length + 1, dtype=np.float64))))


class _Capture:
    """Per-query entropies of the sampled layers/heads during one forward: layer -> tensor [positions]."""

    def __init__(self, layers: set[int] | None, heads: tuple[int, ...] | None, chunk: int) -> None:
        self.layers, self.heads, self.chunk = layers, heads, chunk
        self.per_layer: dict[int, torch.Tensor] = {}
        self.counter = 0

    def reset(self) -> None:
        self.per_layer, self.counter = {}, 0

    def observe(self, module: Any, query: torch.Tensor, key: torch.Tensor, mask: Any, scaling: float | None,
                kwargs: dict[str, Any]) -> None:
        layer = getattr(module, "layer_idx", None)
        if layer is None:
            layer = self.counter
        self.counter += 1
        if self.layers is not None and layer not in self.layers:
            return
        if kwargs.get("softcap") is not None or getattr(module, "sinks", None) is not None:
            raise CtxevalError("entropy: this model's attention uses logit soft-capping or sinks, which the entropy "
                               "measurement does not model")
        # query [B, H, q, D], key [B, Hkv, k, D]
        b, n_heads, n_q, dim = query.shape
        n_k = key.shape[-2]
        if b != 1 or n_q != n_k:
            raise CtxevalError("entropy measures one full-sequence forward at a time (batch 1, no cache)")
        heads = list(self.heads) if self.heads is not None else list(range(n_heads))
        if max(heads) >= n_heads:
            raise CtxevalError(f"--heads {max(heads)} is out of range: the model has {n_heads} query heads")
        group = n_heads // key.shape[1]
        q = query[0, heads].float()  # [h, q, D]
        k = key[0, [h // group for h in heads]].float()  # [h, k, D]
        scale = float(scaling) if scaling is not None else dim ** -0.5
        out = torch.empty(n_q, dtype=torch.float64, device=query.device)
        pos_k = torch.arange(n_k, device=query.device)
        for c0 in range(0, n_q, self.chunk):
            c1 = min(n_q, c0 + self.chunk)
            z = torch.einsum("hqd,hkd->hqk", q[:, c0:c1], k[:, :c1]) * scale  # [h, c, c1]
            allowed = pos_k[:c1][None, :] <= torch.arange(c0, c1, device=query.device)[:, None]  # [c, c1]
            if isinstance(mask, torch.Tensor):
                m = mask[0, :, c0:c1, :c1] if mask.dim() == 4 else mask[..., c0:c1, :c1]
                if m.dtype == torch.bool:
                    allowed = allowed & m.reshape(-1, c1 - c0, c1).all(0)
                else:
                    z = z + m.float().reshape(-1, c1 - c0, c1)
            z = z.masked_fill(~allowed, float("-inf"))
            logp = torch.log_softmax(z, dim=-1)
            ent = -(logp.exp() * logp.masked_fill(~allowed, 0.0)).sum(-1)  # [h, c]
            out[c0:c1] = ent.mean(0).double()
        self.per_layer[int(layer)] = out.cpu()


_ACTIVE: list[_Capture] = []


def _wrapped(original: Any) -> Any:
    def sdpa_with_entropy(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          attention_mask: Any, *args: Any, **kwargs: Any) -> Any:
        if _ACTIVE:
            scaling = kwargs.get("scaling", args[1] if len(args) > 1 else None)
            _ACTIVE[-1].observe(module, query, key, attention_mask, scaling, kwargs)
        return original(module, query, key, value, attention_mask, *args, **kwargs)

    return sdpa_with_entropy


@contextlib.contextmanager
def capture(model: Any, cfg: EntropyConfig) -> Iterator[_Capture]:
    """Wrap transformers' sdpa attention function while the block runs; yields the capture object."""
    from transformers.modeling_utils import AttentionInterface

    impl = getattr(model.config.get_text_config(), "_attn_implementation", None)
    if impl != "sdpa":
        raise CtxevalError(f"entropy reads q and k through transformers' sdpa attention, and this model runs '{impl}' "
                           "(transformers has no sdpa path for its architecture); entropy cannot measure it")
    cap = _Capture(set(cfg.layers) if cfg.layers is not None else None, cfg.heads, cfg.query_chunk)
    mapping = AttentionInterface._global_mapping
    original = mapping["sdpa"]
    mapping["sdpa"] = _wrapped(original)
    _ACTIVE.append(cap)
    try:
        yield cap
    finally:
        _ACTIVE.remove(cap)
        mapping["sdpa"] = original


class EntropyRunner:
    KEY = ("label", "length", "doc")

    def __init__(self, model: Any, device: str, cfg: EntropyConfig, bos_id: int | None, model_name: str,
                 progress: Progress | None = None) -> None:
        self.model, self.device, self.cfg, self.bos_id = model, device, cfg, bos_id
        self.model_name, self.progress = model_name, progress or _Silent()

    def _ids(self, doc: TokenDoc, length: int) -> torch.Tensor:
        if self.cfg.bos and self.bos_id is not None:
            ids = [self.bos_id] + doc.ids[: length - 1].tolist()
        else:
            ids = doc.ids[:length].tolist()
        return torch.tensor([ids], device=self.device)

    def _forward(self, cap: _Capture, doc: TokenDoc, length: int) -> dict[int, torch.Tensor]:
        cap.reset()
        try:
            body = getattr(self.model, self.model.base_model_prefix, self.model)  # no LM head: no [L x vocab] logits
            with torch.inference_mode():
                body(input_ids=self._ids(doc, length), use_cache=False)
        except Exception as exc:  # noqa: BLE001
            if _is_oom(exc):
                if self.device.startswith("cuda"):
                    torch.cuda.empty_cache()
                raise PointOOM(str(exc).splitlines()[0] if str(exc) else "out of memory") from None
            raise
        if not cap.per_layer:
            raise CtxevalError("entropy: no attention call was seen; this model does not use transformers' "
                               "attention functions (sdpa)")
        return dict(cap.per_layer)

    def _row(self, spec: MethodSpec, doc: TokenDoc, length: int, per_layer: dict[int, torch.Tensor],
             seconds: float) -> dict[str, Any]:
        layers = sorted(per_layer)
        values = [float(per_layer[l][:length].mean()) for l in layers]
        return {"model": self.model_name, "method": spec.name, "label": spec.label, "params": spec.record_params,
                "task": "entropy", "length": length, "doc": doc.doc_id, "layers": layers,
                "entropy_per_layer": values, "entropy": float(np.mean(values)),
                "uniform_entropy": uniform_entropy(length), "heads": list(self.cfg.heads) if self.cfg.heads else "all",
                "seconds": seconds, "status": "ok"}

    def measure(self, spec: MethodSpec, doc: TokenDoc, lengths: list[int], cap: _Capture, append: Any,
                static: bool = True) -> None:
        """One forward at max(lengths) for a static method (falls back to one forward per length when it runs out
        of memory, so shorter lengths are still measured); one forward per length otherwise."""
        groups = [sorted(lengths)] if static else [[L] for L in sorted(lengths)]
        while groups:
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
                append([{"model": self.model_name, "method": spec.name, "label": spec.label,
                         "params": spec.record_params, "task": "entropy", "length": L, "doc": doc.doc_id,
                         "status": "oom", "error": str(exc)} for L in group])
                self.progress.note(f"{spec.label}: out of memory at {top} tokens")
                continue
            seconds = time.perf_counter() - t0
            append([self._row(spec, doc, L, per_layer, seconds) for L in group])
            self.progress.advance(top, f"{spec.label} {doc.doc_id} L={top}")


def sweep(lm: Any, specs: list[MethodSpec], docs: list[TokenDoc], cfg: EntropyConfig, store: Any,
          progress: Progress | None = None) -> None:
    """Every (method, length, document) point not yet in `store`, one method applied at a time."""
    from ..distributed import current
    from .applied import forward_cost, length_dependent, plan_groups, run_items

    progress = progress or _Silent()
    runner = EntropyRunner(lm.model, lm.device, cfg, getattr(lm.tokenizer, "bos_token_id", None), lm.name, progress)
    done = {store.key(r, EntropyRunner.KEY) for r in store.rows() if r.get("status") == "ok"}
    todo = {(i, doc.doc_id): [L for L in cfg.lengths
                              if store.key({"label": s.label, "length": L, "doc": doc.doc_id}, EntropyRunner.KEY) not in done]
            for i, s in enumerate(specs) for doc in docs}
    few = current().world > sum(1 for v in todo.values() if v)
    dynamic = {s.label for s in specs if length_dependent(s, lm)}
    items: list[tuple[int, Any, float, int, int]] = []
    for index, spec in enumerate(specs):
        for doc in docs:
            for group in plan_groups(todo[(index, doc.doc_id)], spec.label in dynamic, few):
                cost = sum(map(forward_cost, group)) if spec.label in dynamic else forward_cost(max(group))
                items.append((index, (doc, group), cost, sum(group) if spec.label in dynamic else max(group), max(group)))
    with capture(lm.model, cfg) as cap:
        run_items(lm, specs, items, cfg.lengths, store, progress,
                  lambda spec, item, _handle: runner.measure(spec, item[0], item[1], cap, store.append,
                                                             static=spec.label not in dynamic))


def check_layers(n_layers: int, layers: tuple[int, ...] | None) -> None:
    if layers is not None and (min(layers) < 0 or max(layers) >= n_layers):
        raise CtxevalError(f"--layers must be in 0..{n_layers - 1}, got {','.join(map(str, layers))}")


def entropy_tables(rows: list[dict[str, Any]], order: list[str]) -> tuple[Any, Any]:
    """ok rows -> (mean entropy [method x length] averaged over documents, per-layer [method, layer x length])."""
    import pandas as pd

    ok = [r for r in rows if r.get("status") == "ok" and r.get("task") == "entropy"]
    if not ok:
        return pd.DataFrame(), pd.DataFrame()
    df = pd.DataFrame(ok).drop_duplicates(subset=["label", "length", "doc"], keep="last")
    wide = df.pivot_table(index="label", columns="length", values="entropy", aggfunc="mean")
    uniform = df.groupby("length")["uniform_entropy"].first()
    wide = wide.reindex([l for l in order if l in wide.index])
    wide.loc["uniform (ln of visible keys)"] = uniform
    per_layer = []
    for r in df.itertuples():
        for layer, value in zip(r.layers, r.entropy_per_layer):
            per_layer.append({"label": r.label, "layer": layer, "length": r.length, "entropy": value})
    layers = pd.DataFrame(per_layer).pivot_table(index=["label", "layer"], columns="length", values="entropy", aggfunc="mean")
    layers = layers.reindex([i for l in order for i in layers.index if i[0] == l])
    return wide, layers
