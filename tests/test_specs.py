"""specs.MethodSpec carries its resolved method: the Method and the validated parameters are looked up once, when the
spec is made, and equal what get_method and resolve_params give; a dynamic method's spec says it depends on the
sequence length."""

import pytest

from ctxeval.errors import CtxevalError
from ctxeval.rope.methods import METHODS, get_method, resolve_params
from ctxeval.specs import MethodSpec, expand_specs, parse_spec

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
