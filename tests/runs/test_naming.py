"""runs/naming.py: a command's default run directory names what it measures, not how it runs."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from ctxeval.cli.entropy import EntropyOptions
from ctxeval.cli.lm_eval import LmEvalOptions
from ctxeval.cli.needle import NeedleOptions, PasskeyOptions
from ctxeval.cli.options import block_parameters, build_block
from ctxeval.cli.ppl import PplOptions
from ctxeval.cli.ruler import RulerOptions
from ctxeval.cli.tune import TuneOptions
from ctxeval.runs.naming import HOW_NOT_WHAT, default_out, request_of

COMMANDS: dict[str, type] = {
    "ppl": PplOptions,
    "needle": NeedleOptions,
    "passkey": PasskeyOptions,
    "ruler": RulerOptions,
    "entropy": EntropyOptions,
    "lm-eval": LmEvalOptions,
    "tune": TuneOptions,
}
PLACEMENT = {"device", "device_map", "max_memory"}  # the Load block's
VLLM_RESOURCES = {"tensor_parallel_size", "pipeline_parallel_size", "gpu_memory_utilization"}  # the Engine block's
# Each command's options that say how it runs or renders, written out here (not read from HOW_NOT_WHAT): changing one
# of them must keep the default run directory, changing any other option must name another.
HOW = {
    "ppl": {"out", "overwrite", "batch_size", "chunk_size", "valid_tolerance", "dry_run", *PLACEMENT},
    "needle": {"out", "overwrite", "batch_size", "threshold", *PLACEMENT, *VLLM_RESOURCES},
    "passkey": {"out", "overwrite", "batch_size", "threshold", *PLACEMENT, *VLLM_RESOURCES},
    "ruler": {"out", "overwrite", "batch_size", "threshold", *PLACEMENT, *VLLM_RESOURCES},
    "entropy": {"out", "overwrite", "query_chunk", *PLACEMENT},
    "lm-eval": {"out", "overwrite", "batch_size", "log_samples", "device", *VLLM_RESOURCES},  # Load without placement
    "tune": {"out", "overwrite", "trials", "time_budget", "export", "chunk_size", "device"},  # the same
}


def options(command: str, /, **given: Any) -> Any:
    """The command's options object as the CLI builds it (its blocks filled by with_blocks' build_block), every
    option at its default except `given` (and lm-eval's required --tasks)."""
    values = {p.name: p.default for p in block_parameters(COMMANDS[command])}
    values.update({"tasks": "x"} if command == "lm-eval" else {}, **given)
    return build_block(COMMANDS[command], values)


def run_dir(task: str, opt: Any) -> Path:
    return default_out(task, "tiny", None, request_of(task, opt))


def test_default_out_depends_on_what_is_measured_only() -> None:
    base = {"command": "ppl", "lengths": "1k", "method": ["none"]}
    assert default_out("ppl", "tiny", None, base) == default_out("ppl", "tiny", None, dict(base))
    assert default_out("ppl", "tiny", None, base) != default_out("ppl", "tiny", None, {**base, "lengths": "2k"})
    assert default_out("ppl", "tiny", Path("mine"), base) == Path("mine")


def test_request_of_leaves_out_how_a_run_is_executed() -> None:
    from ctxeval.cli.options import Load

    fields = {f.name for f in dataclasses.fields(PplOptions)}
    given = {name: None for name in fields}
    small = PplOptions(**{**given, "batch_size": 1, "load": Load(device="cpu")})
    large = PplOptions(**{**given, "batch_size": 8, "load": Load(device="cuda")})
    assert request_of("ppl", small) == request_of("ppl", large)
    assert request_of("ppl", small) != request_of("ppl", PplOptions(**{**given, "lengths": "1k"}))
    assert request_of("ppl", None) is None


@pytest.mark.parametrize("task", sorted(COMMANDS))
def test_exactly_the_how_options_of_each_command_keep_its_default_directory(task: str) -> None:
    """Every option of every measuring command, changed alone through the CLI's own option dataclasses: the default
    directory stays the same for the options that say how the run goes (HOW above: placement, memory, batch, trial
    count and time budget, what is rendered or exported) and changes for every other one. Bugs caught: an option of
    HOW_NOT_WHAT dropped from it (a rerun with more --trials, a larger --time-budget or another --chunk-size would
    start over in a new directory), or a name added that some command measures by."""
    base = run_dir(task, options(task))
    kept = set()
    for param in block_parameters(COMMANDS[task]):
        changed = options(task, **{param.name: f"<another {param.name}>"})
        if run_dir(task, changed) == base:
            kept.add(param.name)
    assert kept == HOW[task]


def test_every_name_in_how_not_what_is_an_option_that_keeps_some_commands_directory() -> None:
    """The set holds nothing beyond the commands' how options (a typo there would leave its option measured by)."""
    assert set().union(*HOW.values()) == HOW_NOT_WHAT


def test_a_rerun_with_more_trials_or_a_larger_time_budget_names_the_same_directory() -> None:
    """The cases users meet, with real values: a search given more --trials or minutes continues (its study is in
    the directory); another target length or method is another run."""
    base = run_dir("tune", options("tune", target_length="1k", trials=10, time_budget=5.0))
    assert run_dir("tune", options("tune", target_length="1k", trials=100, time_budget=60.0, chunk_size=256)) == base
    assert run_dir("tune", options("tune", target_length="2k", trials=10, time_budget=5.0)) != base
    assert run_dir("tune", options("tune", target_length="1k", method=["ntk"], trials=10)) != base
    assert run_dir("ppl", options("ppl", batch_size=1, chunk_size=128)) == run_dir("ppl", options("ppl"))
    assert run_dir("entropy", options("entropy", query_chunk=64)) == run_dir("entropy", options("entropy"))
