"""Where a run directory goes by default: runs/<task>-<model>-<8 hex digits of what the command measures>, so that
the same command again names the same directory and resumes it."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

from ..util.paths import safe_name

RUNS_DIR = "runs"  # default parent of run directories: not results/, which a checkout keeps for committed runs
# Options that say how a run is executed or rendered, not what it measures: a rerun that changes only these (a
# smaller --batch-size after an out-of-memory, more --trials or a larger --time-budget for a search) resumes the same
# default directory. None of them is in a run's spec, so the directory accepts the rerun. Options that change what is
# measured stay out (--passkey and --compare add measurements, --storage holds another study, --max-model-len sizes
# vLLM's RoPE tables for the dynamic methods).
HOW_NOT_WHAT = frozenset(
    {
        "out",
        "overwrite",
        "batch_size",
        "chunk_size",  # ppl, tune: positions per LM-head chunk (memory)
        "query_chunk",  # entropy: queries per chunk (memory)
        "device",
        "device_map",
        "max_memory",
        "gpu_memory_utilization",
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "threshold",
        "valid_tolerance",
        "dry_run",
        "trials",
        "time_budget",
        "export",
        "log_samples",
    }
)


def request_of(task: str, options: Any) -> dict[str, Any] | None:
    """A command's options (its dataclass, blocks such as Load flattened into it) as the user gave them, less
    HOW_NOT_WHAT; None when the command keeps no options dataclass (a caller of Measurement from Python)."""
    if options is None or not is_dataclass(options):
        return None
    flat: dict[str, Any] = {"command": task}
    for key, value in asdict(options).items():
        flat.update(value if isinstance(value, dict) else {key: value})
    return {k: v for k, v in flat.items() if k not in HOW_NOT_WHAT}


def default_out(task: str, model: str, out: Path | None, request: dict[str, Any] | None = None) -> Path:
    """--out, or runs/<task>-<model>-<8 hex digits of the request> under the working directory: the same command
    again names the same directory, so rerunning it resumes (outside a command line: the time instead)."""
    if out is not None:
        return out
    if request is None:
        return Path(RUNS_DIR) / f"{task}-{safe_name(model)}-{time.strftime('%Y%m%d-%H%M%S')}"
    digest = hashlib.sha256(json.dumps(request, sort_keys=True, default=str).encode()).hexdigest()[:8]
    return Path(RUNS_DIR) / f"{task}-{safe_name(model)}-{digest}"


__all__ = ["HOW_NOT_WHAT", "RUNS_DIR", "default_out", "request_of"]
