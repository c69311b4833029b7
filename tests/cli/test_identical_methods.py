"""Two methods are measured once only when their RoPE is the same to rounding (specs.identical_methods: inv_freq and
attention factor within 1e-12 of each other at every length asked): a method 0.1% away is another method, measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ctxeval.cli import app
from ctxeval.rope.methods import Geometry
from ctxeval.specs import expand_specs, identical_methods

G = Geometry(rotary_dim=32, base=100_000.0, original_length=128)  # the tiny model's


@pytest.mark.parametrize(
    "near",
    [
        ["ntk:factor=4", "ntk:factor=4.004"],  # inv_freq up to 0.1% apart, attention factor 1 for both
        ["yarn:factor=4,attention_factor=1.2", "yarn:factor=4,attention_factor=1.2012"],  # the same inv_freq
    ],
)
def test_a_method_a_tenth_of_a_percent_away_is_not_identical(near: list[str]) -> None:
    """Bug caught: the tolerance of either comparison loosened (rtol 1e-12 -> 1e-3) so that ntk:factor=4.004 or an
    attention factor 0.1% away is taken for the earlier method and its rows copied."""
    assert identical_methods(expand_specs(near), [64, 256], G) == {}
    # a factor 2.5e-14 away is the same RoPE to rounding: still one measurement
    same = expand_specs([near[0], near[0].replace("factor=4", "factor=4.0000000000001", 1)])
    assert identical_methods(same, [64, 256], G) == {same[1].label: same[0].label}


def test_ntk_at_4_004_is_measured_not_copied_from_ntk_at_4(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end: `ctxeval ppl -m ntk:factor=4 -m ntk:factor=4.004 -m yarn:factor=4 -m yarn:factor=4,beta_fast=32`
    measures both ntk methods (their own rows, their own perplexities) and copies only the yarn written twice (the
    copy still happens where it should). Bug caught: the identical-method tolerance 1e-12 -> 1e-3 on inv_freq."""
    from ctxeval.evals import perplexity

    measured: list[str] = []
    real_sweep = perplexity.sweep

    def counting(lm, specs, *args, **kwargs):  # type: ignore[no-untyped-def]
        measured.extend(spec.label for spec in specs)
        return real_sweep(lm, specs, *args, **kwargs)

    monkeypatch.setattr(perplexity, "sweep", counting)
    monkeypatch.chdir(tmp_path)
    methods = ["ntk:factor=4", "ntk:factor=4.004", "yarn:factor=4", "yarn:factor=4,beta_fast=32"]
    args = ["ppl", "--model", "tiny", "--lengths", "256", "--docs", "1", "--out", "run"]
    result = CliRunner().invoke(app, [*args, *(f for m in methods for f in ("-m", m))], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert measured == ["ntk(factor=4)", "ntk(factor=4.004)", "yarn(factor=4)"]
    rows = {r["label"]: r for r in map(json.loads, (tmp_path / "run" / "rows.jsonl").read_text().splitlines())}
    assert "same_as" not in rows["ntk(factor=4.004)"] and "same_as" not in rows["ntk(factor=4)"]
    assert rows["ntk(factor=4.004)"]["value"] != rows["ntk(factor=4)"]["value"]
    assert rows["yarn(beta_fast=32,factor=4)"]["same_as"] == "yarn(factor=4)"
