"""runs/naming.py: a command's default run directory names what it measures, not how it runs."""

import dataclasses
from pathlib import Path

from ctxeval.runs.naming import default_out, request_of


def test_default_out_depends_on_what_is_measured_only():
    base = {"command": "ppl", "lengths": "1k", "method": ["none"]}
    assert default_out("ppl", "tiny", None, base) == default_out("ppl", "tiny", None, dict(base))
    assert default_out("ppl", "tiny", None, base) != default_out("ppl", "tiny", None, {**base, "lengths": "2k"})
    assert default_out("ppl", "tiny", Path("mine"), base) == Path("mine")


def test_request_of_leaves_out_how_a_run_is_executed():
    from ctxeval.cli.options import Load
    from ctxeval.cli.ppl import PplOptions

    fields = {f.name for f in dataclasses.fields(PplOptions)}
    given = {name: None for name in fields}
    small = PplOptions(**{**given, "batch_size": 1, "load": Load(device="cpu")})
    large = PplOptions(**{**given, "batch_size": 8, "load": Load(device="cuda")})
    assert request_of("ppl", small) == request_of("ppl", large)
    assert request_of("ppl", small) != request_of("ppl", PplOptions(**{**given, "lengths": "1k"}))
    assert request_of("ppl", None) is None
