"""specs.MethodSpec carries its resolved method: the Method and the validated parameters are looked up once, when the
spec is made, and equal what get_method and resolve_params give; a dynamic method's spec says it depends on the
sequence length."""

from __future__ import annotations

import random

import pytest

from ctxeval.errors import CtxevalError
from ctxeval.rope.methods import METHODS, Geometry, get_method, resolve_params
from ctxeval.specs import (
    MethodSpec,
    default_factor,
    expand_specs,
    identical_methods,
    parse_spec,
    plain_rope_notes,
    with_default_factors,
)

SPECS = [
    "none",
    "native",
    "linear:factor=2",
    "ntk:alpha=3",
    "dynamic-ntk:factor=2",
    "dynamic-ntk:rule=paper",
    "ntk-by-parts:factor=4,alpha=2",
    "yarn:factor=4,beta=16",
    "dynamic-yarn:finetuned_factor=2",
    "llama3",
    "longrope:short_factor=1;1;1;1,long_factor=2;2;2;2,factor=4",
    "yarn:factor=2+logn",
    "self-extend",
]


@pytest.mark.parametrize("text", SPECS)
def test_a_spec_holds_the_method_and_params_get_method_and_resolve_params_give(text):
    for spec in [parse_spec(text), *expand_specs([text], factors=[2.0, 8.0], temperatures=[1.0, 1.2])]:
        assert spec.method is get_method(spec.name)
        assert spec.resolved == resolve_params(get_method(spec.name), spec.params)
        assert spec.length_dependent is get_method(spec.name).length_dependent


def test_a_spec_of_a_dynamic_method_says_it_depends_on_the_length_and_a_static_one_does_not():
    from ctxeval.evals.sweep import length_dependent

    dynamic = {name for name, method in METHODS.items() if method.length_dependent}
    assert dynamic == {"dynamic-ntk", "dynamic-yarn", "longrope"}
    for spec in expand_specs(["dynamic-ntk:factor=2", "dynamic-yarn", "longrope:short_factor=1;1,long_factor=2;2"]):
        assert spec.length_dependent and length_dependent(spec, None)
    for spec in expand_specs(["none", "native", "pi:factor=2", "ntk:factor=2", "yarn:factor=2", "llama3", "rerope"]):
        assert not spec.length_dependent and not length_dependent(spec, None)


def test_the_resolved_params_fill_the_defaults_and_map_paper_names_but_the_label_shows_what_was_given():
    (spec,) = expand_specs(["yarn:factor=4,alpha=2"])
    assert spec.params == {"factor": 4.0, "beta_slow": 2.0} and spec.label == "yarn(beta_slow=2,factor=4)"
    assert spec.resolved["beta_slow"] == 2.0 and spec.resolved["beta_fast"] == 32.0 and spec.resolved["ramp"] == "index"
    assert parse_spec("linear:factor=2").method.name == "pi"


def test_a_spec_is_validated_when_it_is_made_with_resolve_params_own_error():
    with pytest.raises(CtxevalError) as direct:
        resolve_params(get_method("yarn"), {"beta_slow": 40})
    with pytest.raises(CtxevalError) as made:
        MethodSpec("yarn", {"beta_slow": 40})
    assert str(made.value) == str(direct.value)
    with pytest.raises(CtxevalError, match="unknown method 'bogus'"):
        MethodSpec("bogus", {})


def test_the_resolved_method_takes_no_part_in_equality_or_repr():
    made = MethodSpec("yarn", {"factor": 2.0})
    assert made == expand_specs(["yarn:factor=2"])[0]
    assert repr(made) == "MethodSpec(name='yarn', params={'factor': 2.0}, temperature=1.0, attention=())"


def test_the_ppl_runner_measures_length_by_length_what_the_sweep_or_the_method_says_depends_on_the_length():
    from ctxeval.evals.perplexity import PplConfig, PplRunner

    runner = PplRunner(None, "cpu", PplConfig((16, 32)), 1, "tiny")
    native, yarn, dynamic = expand_specs(["native", "yarn:factor=2", "dynamic-ntk:factor=2"])
    assert not runner.length_dependent(native) and not runner.length_dependent(yarn)
    assert runner.length_dependent(dynamic)
    runner.dynamic = {native.label}  # the sweep's word for a checkpoint that ships a dynamic RoPE
    assert runner.length_dependent(native) and not runner.length_dependent(yarn)


G = Geometry(rotary_dim=16, base=10_000.0, original_length=128)


def labels(specs):
    return [s.label for s in specs]


def test_open_factors_cover_the_longest_length():
    specs = expand_specs(["none", "yarn", "pi", "ntk", "ntk-by-parts", "yarn:beta_fast=4,beta_slow=0.25"])
    out, notes = with_default_factors(specs, 1024, G)
    assert labels(out) == [
        "none",
        "yarn(factor=8)",
        "pi(factor=8)",
        "ntk(factor=8)",
        "ntk-by-parts(factor=8)",
        "yarn(beta_fast=4,beta_slow=0.25,factor=8)",
    ]
    assert notes == [
        "yarn, pi, ntk, ntk-by-parts, yarn(beta_fast=4,beta_slow=0.25): factor 8 = the longest length "
        "1,024 / the trained length 128; give --factor or NAME:factor=S to choose"
    ]


def test_given_factors_and_methods_with_their_own_defaults_are_kept():
    specs = expand_specs(
        [
            "yarn:factor=4",
            "ntk:alpha=2",
            "ntk:base=50000",
            "dynamic-ntk",
            "dynamic-ntk:rule=paper",
            "llama3",
            "dynamic-yarn",
            "none+logn",
            "self-extend",
        ]
    )
    out, notes = with_default_factors(specs, 1024, G)
    assert labels(out) == labels(specs) and notes == []
    swept = expand_specs(["yarn", "pi"], factors=[2, 4])  # --factor wins over the default
    assert labels(with_default_factors(swept, 1024, G)[0]) == labels(swept)


def test_the_method_own_original_length_sets_its_factor_and_duplicates_merge():
    specs = expand_specs(["yarn:original_max_position_embeddings=64", "yarn", "yarn:factor=8"])
    out, notes = with_default_factors(specs, 1024, G)
    assert labels(out) == ["yarn(factor=16,original_max_position_embeddings=64)", "yarn(factor=8)"]
    assert len(notes) == 2 and "1,024 / the trained length 64" in notes[0]


def test_a_length_within_the_trained_one_gives_factor_1_and_says_so():
    out, notes = with_default_factors(expand_specs(["pi"]), 100, G)
    assert labels(out) == ["pi(factor=1)"]
    assert notes == [
        "pi: factor 1, as the longest length 100 is within the trained length 128; give --factor or "
        "NAME:factor=S to choose"
    ]


def test_default_factor_covers_the_length_by_at_most_a_hundredth():
    draw = random.Random(26)
    cases = [(1024, 128), (300, 128), (131_072, 4096), (4097, 4096), (4096, 4096), (1, 8192), (3 * 4096, 4096)]
    cases += [(draw.randint(1, 2_000_000), draw.randint(1, 200_000)) for _ in range(2000)]
    for longest, trained in cases:
        f = default_factor(longest, trained)
        assert f >= 1 and f * trained >= longest * (1 - 1e-12), (longest, trained, f)
        assert f == 1 or f - longest / trained < 0.01 + 1e-12, (longest, trained, f)
        assert round(f, 2) == f
    assert default_factor(131_072, 4096) == 32 and default_factor(300, 128) == 2.35


def test_plain_rope_notes_name_exactly_the_methods_that_change_nothing():
    specs = expand_specs(
        [
            "none",
            "yarn:factor=1",
            "pi:factor=1",
            "ntk:factor=1",
            "ntk-by-parts:factor=1",
            "yarn:factor=2",
            "dynamic-ntk",
            "llama3:factor=1",
            "self-extend",
            "native",
        ]
    )
    specs += expand_specs(["pi:factor=1"], temperatures=[1.2])
    notes = plain_rope_notes(specs, [64, 128], G)
    flagged = [n.split(" is plain RoPE")[0] for n in notes]
    assert flagged == [
        "yarn(factor=1)",
        "pi(factor=1)",
        "ntk(factor=1)",
        "ntk-by-parts(factor=1)",
        "dynamic-ntk",
        "llama3(factor=1)",
    ]
    assert "it rescales only longer sequences" in notes[4]
    past = plain_rope_notes(expand_specs(["dynamic-ntk", "dynamic-yarn"]), [64, 256], G)
    assert past == []  # past the trained length the dynamic methods rescale


def test_identical_methods_pair_each_method_with_the_first_that_measures_the_same():
    specs = expand_specs(
        [
            "yarn:factor=2",
            "none",
            "yarn:factor=1",
            "pi:factor=2",
            "ntk:factor=1",
            "dynamic-ntk",
            "native",
            "self-extend",
        ]
    )
    specs += expand_specs(["pi:factor=1"], temperatures=[1.2])
    twins = identical_methods(specs, [64, 128], G)
    # the first of equals is measured: none (yarn:factor=2 differs); native, attention and temperature never pair
    assert twins == {"yarn(factor=1)": "none", "ntk(factor=1)": "none", "dynamic-ntk": "none"}
    assert identical_methods(specs, [64, 256], G) == {"yarn(factor=1)": "none", "ntk(factor=1)": "none"}
    # equal to each other without none: the later copies the earlier
    assert identical_methods(expand_specs(["yarn:factor=2", "yarn:factor=2,beta_fast=32"]), [64], G) == {
        "yarn(beta_fast=32,factor=2)": "yarn(factor=2)"
    }
    assert identical_methods(specs, [64], None) == {}


def test_the_qwen3_yarn_preset_is_the_model_cards_rope_scaling_as_transformers_computes_it():
    """`-m qwen3-yarn` on a Qwen3 config (max_position_embeddings 40960, as Qwen3's config.json) equals transformers'
    yarn from the cards' rope_scaling {factor 4, original 32768}; a parameter after the name replaces the preset's.
    Bug caught: the preset's original length dropped (ctxeval would ramp over Qwen3's 40960: other frequencies), or
    the user's factor overridden by the preset's."""
    import numpy as np
    from transformers import Qwen3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from ctxeval.rope.geometry import rope_info_from_config
    from ctxeval.rope.methods import compute
    from ctxeval.specs import expand_specs

    shipped = Qwen3Config(head_dim=128, max_position_embeddings=40960, rope_parameters={"rope_theta": 1e6})
    card = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768, "rope_theta": 1e6}
    with_card = Qwen3Config(head_dim=128, max_position_embeddings=131072, rope_parameters=card)
    want, want_factor = ROPE_INIT_FUNCTIONS["yarn"](with_card, "cpu")
    geometry = rope_info_from_config(shipped).geometry
    assert geometry.original_length == 40960  # what ctxeval would take without the preset's original length
    preset, overridden = expand_specs(["qwen3-yarn", "qwen3-yarn:factor=2"])
    got = compute(preset.method, geometry, preset.params)
    assert preset.label == "yarn(factor=4,original_max_position_embeddings=32768)"
    np.testing.assert_allclose(got.inv_freq, want.double().numpy(), rtol=1e-6)
    assert got.attention_factor == pytest.approx(want_factor, rel=1e-12)
    assert overridden.resolved["factor"] == 2.0 and overridden.resolved["original_max_position_embeddings"] == 32768
