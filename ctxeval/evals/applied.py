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


def run_items(lm: Any, specs: list[MethodSpec], items: list[tuple[int, Any, float]], lengths: tuple[int, ...],
              store: Any, progress: Any, work: Callable[[MethodSpec, Any, Any], None]) -> None:
    """Measure work items (spec index, payload, cost in tokens) one method at a time.

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
    progress.start(int(sum(it[2] for it in mine)))
    for index, spec in enumerate(specs):
        payloads = [it[1] for it in mine if it[0] == index]
        if not payloads:
            continue
        with applied(lm, spec, lengths, store, effective) as handle:
            for payload in payloads:
                work(spec, payload, handle)
