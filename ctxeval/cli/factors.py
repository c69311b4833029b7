"""Factors a user left open: a method named without one (`-m yarn`) gets the factor that covers the longest length
asked, shown in its label; a method that stays plain RoPE at the lengths asked is named in a note."""

from __future__ import annotations

from typing import Any

from ..runs.distributed import current
from ..specs import MethodSpec, plain_rope_notes, with_default_factors
from .console import err


def settle_factors(specs: list[MethodSpec], lengths: list[int], lm: Any) -> list[MethodSpec]:
    """specs.with_default_factors at the longest of `lengths` for the loaded model's RoPE, with its notes (and
    specs.plain_rope_notes) on rank 0's stderr."""
    geometry = lm.rope.geometry
    specs, notes = with_default_factors(specs, max(lengths) if lengths else None, geometry)
    if current().is_main:
        for note in notes + plain_rope_notes(specs, lengths, geometry):
            err.print(f"note: {note}", markup=False)
    return specs
