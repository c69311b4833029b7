"""Every task kind the report knows, in the report's order (a new kind: its module under report/kinds/ and one line
here): name -> report.kind.Kind."""

from __future__ import annotations

from ..runs.rows import KINDS as KIND_NAMES
from .kind import Kind
from .kinds import entropy, lm_eval, needle, ppl, ruler, tune

KINDS: dict[str, Kind] = {
    kind.name: kind
    for kind in (ppl.KIND, needle.NEEDLE, needle.PASSKEY, entropy.KIND, ruler.KIND, lm_eval.KIND, tune.KIND)
}
if tuple(KINDS) != KIND_NAMES:  # the run store's kinds (what a run directory may hold) are the report's
    raise ImportError(f"report kinds {tuple(KINDS)} differ from the run store's {KIND_NAMES}")

__all__ = ["KINDS"]
