"""Sweeps: typed work items, one planner for document sweeps (ppl, entropy), and the loop that applies one method
at a time (RoPE method + attention temperature, read back and recorded before anything is measured) and measures
this rank's share of the items."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Generic, Iterator, Sequence, TypeVar

from ..attention.methods import in_effect
from ..attention.patching import attention_methods, attention_temperature, kernel_of, verify_attention_methods
from ..attention.temperature import query_scale_record
from ..data.corpora import TokenDoc
from ..errors import CtxevalError
from ..models.protocol import LanguageModel
from ..models.vllm_engine import VllmHandle, VllmModel
from ..rope.patching import RopeHandle, apply_method, find_rotary_modules
from ..runs.distributed import current
from ..runs.rows import point_key
from ..runs.store import RunStore
from ..specs import MethodSpec
from .common import Progress

# shipped RoPE types whose transformers module changes its frequencies with the sequence length
DYNAMIC_SHIPPED = {"dynamic", "longrope"}

Payload = TypeVar("Payload")
Handle = RopeHandle | VllmHandle  # a method applied: in place in a transformers model, or in a vLLM engine


@dataclass(frozen=True)
class DocumentBatch:
    """What a document sweep's work item measures (ppl, entropy): documents at the same lengths, one forward per
    document at the longest length for a static method, one per length otherwise."""

    documents: tuple[TokenDoc, ...]  # one, or ppl's --batch-size documents whose sequences share forwards
    lengths: tuple[int, ...]

    @property
    def document(self) -> TokenDoc:
        """The document of a one-document batch (entropy's items, ppl's before batch_documents)."""
        (document,) = self.documents
        return document


@dataclass(frozen=True)
class WorkItem(Generic[Payload]):
    """One unit of work: what a rank measures in one go under one applied method."""

    spec_index: int  # which method spec (index into the sweep's specs)
    payload: Payload  # what the evaluation measures: a DocumentBatch (ppl, entropy), needle's cells, a RulerBatch
    cost: float  # relative compute, to balance ranks (forward_cost summed over the forwards)
    tokens: int  # progress units the item advances by
    length: int  # its longest length: items run shortest first


@contextlib.contextmanager
def applying(
    lm: LanguageModel, spec: MethodSpec, lengths: tuple[int, ...], **engine: Any
) -> Iterator[tuple[Handle, dict[str, Any]]]:
    """Apply the spec's RoPE method, attention temperature and attention methods for the block; yield the RopeHandle
    and the method's record (read-back RoPE, and the attention methods' verification when the spec has any). A vLLM
    model (models.vllm_engine.VllmModel) builds one engine with the method and reads its rotary table back instead."""
    if isinstance(lm, VllmModel):
        with lm.applying(spec, tuple(lengths), **engine) as pair:
            yield pair
        return
    inv_freq = rotary_frequencies(lm, spec)
    original = lm.rope.geometry.original_length if lm.rope.geometry is not None else 0
    with (
        apply_method(lm.model, spec.method, lm.rope.geometry, **spec.params) as handle,
        attention_temperature(lm.model, spec.temperature),
        attention_methods(lm.model, spec.attention, inv_freq, original),
    ):
        record = {**handle.record(tuple(lengths)), "attention_temperature": spec.temperature}
        query_scale = query_scale_record(lm.model, spec.attention, original, native=spec.name == "native")
        if query_scale is not None:
            record["query_scale"] = query_scale
        if spec.attention:
            record["attention_methods"] = [
                {
                    "name": a.name,
                    "params": a.params,
                    **({"in_effect": in_effect(a, original)} if in_effect(a, original) else {}),
                }
                for a in spec.attention
            ]
            record["attention_kernel"] = kernel_of(lm.model, spec.attention)
            record["attention_check"] = verify_attention_methods(
                lm.model, spec.attention, inv_freq, original, lm.device
            )
        yield handle, record


@contextlib.contextmanager
def applied(
    lm: LanguageModel,
    spec: MethodSpec,
    lengths: tuple[int, ...],
    store: RunStore,
    effective: dict[str, Any],
    **engine: Any,
) -> Iterator[Handle]:
    """Yield the RopeHandle; `effective[spec.label]` and run.json's `methods` get the method's record. `engine`: what
    a vLLM model's `applying` takes (`build`, the lm-eval bridge's)."""
    with applying(lm, spec, lengths, **engine) as (handle, record):
        effective[spec.label] = record
        store.update(methods=effective)
        yield handle


def rotary_frequencies(lm: LanguageModel, spec: MethodSpec) -> Callable[[], Any]:
    """The inverse frequencies the model's rotary module holds at call time (attention methods re-rotate with them)."""
    if not spec.attention:
        return lambda: None
    modules = find_rotary_modules(lm.model)
    if lm.rope.geometry is None or not modules:
        raise CtxevalError(
            f"{spec.method_name} re-rotates RoPE's q and k, and this model has no RoPE; use --method none"
        )
    return lambda: modules[0][1].inv_freq


def length_dependent(spec: MethodSpec, lm: LanguageModel | None) -> bool:
    """Whether the method's RoPE depends on the sequence length (then one forward cannot serve shorter lengths).
    `native` is, when the checkpoint ships a dynamic or LongRoPE scaling (Phi-3 picks its factors by length)."""
    if spec.name == "native":
        return getattr(lm, "rope", None) is not None and lm.rope.shipped.get("rope_type") in DYNAMIC_SHIPPED
    return spec.length_dependent


def forward_cost(length: int) -> float:
    """Relative cost of one forward: linear layers ~ L, attention ~ L^2 (dominant past ~16k for 7B models)."""
    return length + length * length / 16384


def plan_groups(todo: list[int], per_length: bool, few_items: bool) -> list[list[int]]:
    """Lengths measured together: all in one forward for a static method, one by one for a dynamic one, or for
    any method when there are fewer work items than ranks (then one forward per length keeps every GPU busy)."""
    if not todo:
        return []
    return [[L] for L in todo] if per_length or few_items else [todo]


def document_items(
    specs: Sequence[MethodSpec],
    docs: Sequence[TokenDoc],
    lengths: Sequence[int],
    done: set[tuple],
    per_length: Callable[[MethodSpec], bool],
    windows: Callable[[TokenDoc], int],
    tokens: Callable[[MethodSpec, TokenDoc, list[int]], int],
) -> list[WorkItem[DocumentBatch]]:
    """The pending (method, document, lengths) items of a document sweep (ppl, entropy).

    `done` holds the point keys (label, length, doc) already measured; `per_length(spec)`: one forward per length
    (length-dependent methods, sliding windows); `windows(doc)`: forwards per length (sliding windows, else 1);
    `tokens(spec, doc, group)`: the progress units of a group."""
    pending = {
        (i, doc.doc_id): [
            L
            for L in lengths
            if point_key({"label": s.label, "length": L, "doc": doc.doc_id}, ("label", "length", "doc")) not in done
        ]
        for i, s in enumerate(specs)
        for doc in docs
    }
    few = current().world > sum(1 for todo in pending.values() if todo)
    items = []
    for index, spec in enumerate(specs):
        separate = per_length(spec)
        for doc in docs:
            for group in plan_groups(pending[(index, doc.doc_id)], separate, few):
                forwards = group if separate else [max(group)]
                items.append(
                    WorkItem(
                        index,
                        DocumentBatch((doc,), tuple(group)),
                        windows(doc) * sum(map(forward_cost, forwards)),
                        tokens(spec, doc, group),
                        max(group),
                    )
                )
    return items


def run_items(
    lm: LanguageModel,
    specs: list[MethodSpec],
    items: list[WorkItem[Payload]],
    lengths: tuple[int, ...],
    store: RunStore,
    progress: Progress,
    work: Callable[[MethodSpec, Payload, Handle], None],
) -> None:
    """Measure work items one method at a time, shortest length first.

    Under torchrun each rank takes its share (distributed.Dist.shard: balanced by cost) and rank 0 first records
    every method's read-back RoPE, so run.json is complete whichever rank measures what. `work(spec, payload,
    handle)` measures one item and appends its rows."""
    dist = current()
    dist.barrier()  # every rank has read the finished points before any rank appends new ones
    effective = dict(store.record.get("methods", {}))
    if dist.active and dist.is_main:
        for spec in specs:
            with applied(lm, spec, lengths, store, effective):
                pass
    mine = dist.shard(items, cost=lambda item: item.cost)
    progress.start(int(sum(item.tokens for item in mine)))
    for index, spec in enumerate(specs):
        # ascending length: a shipped dynamic RoPE (transformers' own state) then sees lengths in order
        payloads = [
            item.payload for item in sorted((it for it in mine if it.spec_index == index), key=lambda it: it.length)
        ]
        if not payloads:
            continue
        with applied(lm, spec, lengths, store, effective) as handle:
            for payload in payloads:
                work(spec, payload, handle)
