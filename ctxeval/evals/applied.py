"""One method spec applied to a loaded model for the duration of a block: RoPE method + attention temperature,
with the effective RoPE (read back from the model) recorded in the run before anything is measured."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

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
