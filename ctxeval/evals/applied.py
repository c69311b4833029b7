"""One method spec applied to a loaded model for the duration of a block: RoPE method + attention temperature,
with the effective RoPE (read back from the model) recorded in the run before anything is measured."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

from ..methods import MethodSpec


@contextlib.contextmanager
def applied(lm: Any, spec: MethodSpec, lengths: tuple[int, ...], store: Any, effective: dict[str, Any]) -> Iterator[Any]:
    """Yield the RopeHandle; `effective[spec.label]` and run.json's `methods` get the method's record."""
    from ..patching import apply_method
    from ..temperature import attention_temperature

    with apply_method(lm.model, spec.name, lm.rope.geometry, **spec.params) as handle, \
            attention_temperature(lm.model, spec.temperature):
        effective[spec.label] = {**handle.record(tuple(lengths)), "attention_temperature": spec.temperature}
        store.update(methods=effective)
        yield handle


# shipped RoPE types whose transformers module changes its frequencies with the sequence length
DYNAMIC_SHIPPED = {"dynamic", "longrope"}


def length_dependent(spec: MethodSpec, lm: Any) -> bool:
    """Whether the method's RoPE depends on the sequence length (then one forward cannot serve shorter lengths).
    `native` is, when the checkpoint ships a dynamic or LongRoPE scaling (Phi-3 picks its factors by length)."""
    from ..methods import get_method

    if spec.name == "native":
        return getattr(lm, "rope", None) is not None and lm.rope.shipped.get("rope_type") in DYNAMIC_SHIPPED
    return bool(get_method(spec.name).length_dependent)


def forward_cost(length: int) -> float:
    """Relative cost of one forward: linear layers ~ L, attention ~ L^2 (dominant past ~16k for 7B models)."""
    return length + length * length / 16384


def plan_groups(todo: list[int], per_length: bool, few_items: bool) -> list[list[int]]:
    """Lengths measured together: all in one forward for a static method, one by one for a dynamic one, or for
    any method when there are fewer work items than ranks (then one forward per length keeps every GPU busy)."""
    if not todo:
        return []
    return [[L] for L in todo] if per_length or few_items else [todo]


def run_items(lm: Any, specs: list[MethodSpec], items: list[tuple[int, Any, float, int, int]],
              lengths: tuple[int, ...], store: Any, progress: Any, work: Callable[[MethodSpec, Any, Any], None]) -> None:
    """Measure work items (spec index, payload, cost, progress tokens, length) one method at a time, shortest
    length first.

    Under torchrun each rank takes its share (distributed.Dist.shard: balanced by cost) and rank 0 first records
    every method's read-back RoPE, so run.json is complete whichever rank measures what. `work(spec, payload,
    handle)` measures one item and appends its rows."""
    from ..distributed import current

    dist = current()
    dist.barrier()  # every rank has read the finished points before any rank appends new ones
    effective = dict(store.record.get("methods", {}))
    if dist.active and dist.is_main:
        for spec in specs:
            with applied(lm, spec, lengths, store, effective):
                pass
    mine = dist.shard(items, cost=lambda it: it[2])
    progress.start(int(sum(it[3] for it in mine)))
    for index, spec in enumerate(specs):
        # ascending length: a shipped dynamic RoPE (transformers' own state) then sees lengths in order
        payloads = [it[1] for it in sorted((it for it in mine if it[0] == index), key=lambda it: it[4])]
        if not payloads:
            continue
        with applied(lm, spec, lengths, store, effective) as handle:
            for payload in payloads:
                work(spec, payload, handle)
