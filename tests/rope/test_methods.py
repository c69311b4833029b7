"""rope/methods.py against transformers' own ROPE_INIT_FUNCTIONS and the papers' formulas."""

import json
import math
import re

import numpy as np
import pytest
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from ctxeval.errors import CtxevalError
from ctxeval.rope.methods import METHODS, Geometry, compute, plan
from ctxeval.specs import expand_specs, parse_spec

# rotary dim, base, original length, factor
GEOMETRIES = [
    (64, 1e4, 2048, 2.0),
    (128, 5e5, 8192, 16.0),
    (128, 1e4, 4096, 4.0),
    (64, 1e5, 8192, 8.0),
    (128, 5e5, 2048, 3.0),
    (64, 25.0, 4096, 4.0),
]  # base 25: YaRN's correction range starts below d/2 and is clamped at d - 1
RTOL = 1e-6  # transformers computes in float32


def _transformers(rope_type, d, b, L, rope_params, seq_len=None):
    rp = {"rope_type": rope_type, "rope_theta": b, **rope_params}
    max_pos = L
    if rope_type in ("yarn", "llama3"):
        rp["original_max_position_embeddings"] = L
        max_pos = int(L * rope_params.get("factor", 1))
    cfg = LlamaConfig(
        hidden_size=4 * d, num_attention_heads=4, head_dim=d, max_position_embeddings=max_pos, rope_parameters=rp
    )
    inv, attention = ROPE_INIT_FUNCTIONS[rope_type](cfg, "cpu", seq_len=seq_len)
    return inv.double().numpy(), attention


def _rel(a, b):
    return float(np.max(np.abs(a - b) / np.abs(b)))


CASES = [
    ("linear", "pi", {}, None),
    ("dynamic", "dynamic-ntk", {}, 3),  # seq_len = 3 L
    ("dynamic", "dynamic-ntk", {}, 1),  # at L: default
    ("yarn", "yarn", {}, None),
    ("yarn", "yarn", {"truncate": False}, None),
    ("yarn", "yarn", {"beta_fast": 16.0, "beta_slow": 2.0}, None),
    ("yarn", "yarn", {"mscale": 0.707, "mscale_all_dim": 0.707}, None),
    ("llama3", "llama3", {"low_freq_factor": 1.0, "high_freq_factor": 4.0}, None),
    ("llama3", "llama3", {"low_freq_factor": 2.0, "high_freq_factor": 8.0}, None),  # L / low != L * low
    ("yarn", "yarn", {"mscale": 2.0}, None),  # mscale alone: the plain 0.1 ln s + 1, as transformers
]


@pytest.mark.parametrize("d,b,L,s", GEOMETRIES)
@pytest.mark.parametrize("rope_type,method,extra,length_mult", CASES)
def test_golden_against_transformers(d, b, L, s, rope_type, method, extra, length_mult):
    seq_len = None if length_mult is None else length_mult * L
    want, want_attention = _transformers(rope_type, d, b, L, {"factor": s, **extra}, seq_len)
    got = compute(method, Geometry(d, b, L), {"factor": s, **extra}, seq_len)
    assert _rel(got.inv_freq, want) < RTOL
    assert got.attention_factor == pytest.approx(want_attention, rel=1e-12)


@pytest.mark.parametrize("d,b,L,s", GEOMETRIES)
@pytest.mark.parametrize("length_mult", [None, 1, 2])
def test_longrope_golden_against_transformers(d, b, L, s, length_mult):
    rng = np.random.default_rng(d + L)
    short, long = (1 + rng.random(d // 2)).round(4).tolist(), (1 + 8 * rng.random(d // 2)).round(4).tolist()
    rp = {
        "rope_type": "longrope",
        "rope_theta": b,
        "short_factor": short,
        "long_factor": long,
        "original_max_position_embeddings": L,
    }
    cfg = LlamaConfig(
        hidden_size=4 * d, num_attention_heads=4, head_dim=d, max_position_embeddings=int(L * s), rope_parameters=rp
    )  # transformers' factor: max_position_embeddings / original
    seq_len = None if length_mult is None else length_mult * L
    want, want_attention = ROPE_INIT_FUNCTIONS["longrope"](cfg, "cpu", seq_len=seq_len)
    got = compute("longrope", Geometry(d, b, L), {"short_factor": short, "long_factor": long, "factor": s}, seq_len)
    assert _rel(got.inv_freq, want.double().numpy()) < RTOL
    assert got.attention_factor == pytest.approx(want_attention, rel=1e-12)
    assert got.attention_factor == pytest.approx(math.sqrt(1 + math.log(s) / math.log(L)), rel=1e-12)  # the paper's


def test_longrope_factor_lists_from_text_files_and_configs(tmp_path):
    d = 8
    (tmp_path / "f.json").write_text('{"short_factor": [1, 1, 1, 1], "long_factor": [1, 2, 4, 8]}')
    (tmp_path / "f.toml").write_text("short_factor = [1.0, 1.0, 1.0, 1.0]\nlong_factor = [1.0, 2.0, 4.0, 8.0]\n")
    (tmp_path / "config.json").write_text(
        '{"rope_scaling": {"type": "longrope", "short_factor": [1, 1, 1, 1], "long_factor": [1, 2, 4, 8]}}'
    )
    geom = Geometry(d, 1e4, 100)
    theta = geom.default_inv_freq()
    for source in ("f.json", "f.toml", "config.json"):
        path = tmp_path / source
        params = {"short_factor": f"@{path}", "long_factor": f"@{path}", "factor": 4}
        np.testing.assert_allclose(compute("longrope", geom, params, 101).inv_freq, theta / [1, 2, 4, 8], rtol=1e-15)
        np.testing.assert_allclose(compute("longrope", geom, params, 100).inv_freq, theta, rtol=1e-15)  # <= L: short
    inline = {"short_factor": "1;1;1;1", "long_factor": "1;2;4;8"}
    np.testing.assert_allclose(compute("longrope", geom, inline, 500).inv_freq, theta / [1, 2, 4, 8], rtol=1e-15)
    spec = expand_specs(["longrope:short_factor=1;1;1;1,long_factor=1;2;4;8,factor=4"])[0]
    assert re.fullmatch(r"longrope\(factor=4,long_factor=4x[0-9a-f]{8},short_factor=4x[0-9a-f]{8}\)", spec.label)
    for params, message in (
        (
            {"short_factor": "1;1", "long_factor": "1;2;4;8"},
            "short_factor has 2 values; this model's rotary dim 8 needs 4",
        ),
        ({"short_factor": "1;0;1;1", "long_factor": "1;2;4;8"}, "positive finite"),
        ({"short_factor": f"@{tmp_path / 'nope.json'}"}, "cannot read"),
        ({"long_factor": "1;2;4;8"}, "longrope needs short_factor"),
    ):
        with pytest.raises(CtxevalError, match=message):
            compute("longrope", geom, params, 500)


@pytest.mark.parametrize("d,b,L,s", GEOMETRIES)
def test_ntk_is_default_rope_at_ntk_base(d, b, L, s):
    new_base = b * s ** (d / (d - 2))
    cfg = LlamaConfig(
        hidden_size=4 * d,
        num_attention_heads=4,
        head_dim=d,
        rope_parameters={"rope_type": "default", "rope_theta": new_base},
    )
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    want = LlamaRotaryEmbedding.compute_default_rope_parameters(cfg)[0].double().numpy()
    assert _rel(compute("ntk", Geometry(d, b, L), {"factor": s}).inv_freq, want) < RTOL
    assert _rel(compute("ntk", Geometry(d, b, L), {"base": new_base}).inv_freq, want) < RTOL
    assert _rel(compute("ntk", Geometry(d, b, L), {"alpha": s}).inv_freq, want) < RTOL


# ---------------------------------------------------------------------------------------------------------- properties

G = Geometry(128, 1e4, 4096)


@pytest.mark.parametrize("name", [m for m in METHODS if m not in ("none", "native")])
def test_factor_one_is_identity(name):
    params = {"factor": 1.0} if METHODS[name].takes_factor else {}
    if name == "longrope":  # unit per-pair factors
        params.update(short_factor=[1.0] * 64, long_factor=[1.0] * 64)
    default = compute("none", G)
    for length in (None, 100, G.original_length):  # dynamic methods: at or below L
        got = compute(name, G, params, length)
        np.testing.assert_allclose(got.inv_freq, default.inv_freq, rtol=1e-12)
        assert got.attention_factor == 1.0


def test_pi_is_default_over_factor():
    for s in (2, 4, 16):
        np.testing.assert_allclose(compute("pi", G, {"factor": s}).inv_freq, G.default_inv_freq() / s, rtol=1e-15)
    np.testing.assert_array_equal(
        compute("linear", G, {"factor": 4}).inv_freq, compute("pi", G, {"factor": 4}).inv_freq
    )


@pytest.mark.parametrize(
    "name,params", [("dynamic-ntk", {"factor": 4}), ("dynamic-ntk", {"rule": "paper"}), ("dynamic-yarn", {})]
)
def test_dynamic_at_or_below_original_length_is_default(name, params):
    for length in (1, 2048, 4096):
        np.testing.assert_allclose(compute(name, G, params, length).inv_freq, G.default_inv_freq(), rtol=1e-12)
    assert not np.allclose(compute(name, G, params, 3 * 4096).inv_freq, G.default_inv_freq())


def test_dynamic_rules_agree_at_factor_one():
    a = compute("dynamic-ntk", G, {"factor": 1}, 10_000)
    b = compute("dynamic-ntk", G, {"rule": "paper"}, 10_000)
    np.testing.assert_allclose(a.inv_freq, b.inv_freq, rtol=1e-12)


@pytest.mark.parametrize("ramp", ["index", "ratio"])
def test_yarn_between_pi_and_default(ramp):
    for s in (2, 8, 32):
        y = compute("yarn", G, {"factor": s, "ramp": ramp}).inv_freq
        assert np.all(y <= G.default_inv_freq() * (1 + 1e-12))
        assert np.all(y >= G.default_inv_freq() / s * (1 - 1e-12))
        assert y[0] == G.default_inv_freq()[0]  # highest frequency kept
        assert y[-1] == pytest.approx(G.default_inv_freq()[-1] / s)  # lowest fully interpolated


def test_yarn_ratio_ramp_follows_the_paper():
    """Paper eq. 18: gamma = 0 for r < alpha, 1 for r > beta, linear in r between; h = (1-gamma) theta/s + gamma theta."""
    s, alpha, beta = 8.0, 1.0, 32.0
    theta = G.default_inv_freq()
    r = G.original_length / (2 * math.pi / theta)
    gamma = np.clip((r - alpha) / (beta - alpha), 0, 1)
    want = (1 - gamma) * theta / s + gamma * theta
    got = compute("yarn", G, {"factor": s, "ramp": "ratio", "alpha": alpha, "beta": beta})
    np.testing.assert_allclose(got.inv_freq, want, rtol=1e-14)
    assert got.attention_factor == pytest.approx(0.1 * math.log(s) + 1)
    # kept exactly where wavelength < L/beta, fully interpolated where wavelength > L/alpha
    wavelength = 2 * math.pi / theta
    np.testing.assert_array_equal(
        got.inv_freq[wavelength < G.original_length / beta], theta[wavelength < G.original_length / beta]
    )
    np.testing.assert_allclose(
        got.inv_freq[wavelength > G.original_length / alpha], theta[wavelength > G.original_length / alpha] / s
    )


def test_ratio_and_index_ramps_differ_only_in_the_blend_region():
    idx = compute("yarn", G, {"factor": 8}).inv_freq
    rat = compute("yarn", G, {"factor": 8, "ramp": "ratio"}).inv_freq
    theta = G.default_inv_freq()
    differ = ~np.isclose(idx, rat, rtol=1e-9)
    assert differ.any()
    _, rows = plan("yarn", G, {"factor": 8})
    blended = np.array([r.group == "blended" for r in rows])
    r = G.original_length / (2 * math.pi / theta)
    # both keep the fastest pairs and interpolate the slowest: differences only where some ramp is blending
    assert not differ[r > 64].any() and not differ[r < 0.5].any()
    assert differ[blended].any()


def test_yarn_attention_factor_and_ntk_by_parts():
    y = compute("yarn", G, {"factor": 16})
    assert y.attention_factor == pytest.approx(0.1 * math.log(16) + 1)
    nbp = compute("ntk-by-parts", G, {"factor": 16})
    np.testing.assert_array_equal(nbp.inv_freq, y.inv_freq)
    assert nbp.attention_factor == 1.0
    assert compute("yarn", G, {"factor": 16, "attention_factor": 1.5}).attention_factor == 1.5


def test_dynamic_yarn_uses_length_over_original():
    dy = compute("dynamic-yarn", G, {}, 3 * 4096)
    y = compute("yarn", G, {"factor": 3})
    np.testing.assert_allclose(dy.inv_freq, y.inv_freq, rtol=1e-14)
    assert dy.attention_factor == pytest.approx(y.attention_factor)


def test_dynamic_yarn_below_the_original_length_is_plain_rope():
    """The paper's s = max(1, l/L): at 3000 of 4096 plain RoPE (the YaRN repo's patch path would apply s = 3000/4096
    there, its lowest frequency 1.37x faster; docs/protocols.md lists it as a difference)."""
    dy = compute("dynamic-yarn", G, {}, 3000)
    np.testing.assert_allclose(dy.inv_freq, G.default_inv_freq(), rtol=1e-15)
    assert dy.attention_factor == 1.0


def test_dynamic_yarn_finetuned_factor_is_the_yarn_repos_finetuned_mode():
    """modeling_llama_together_yarn.py, FlashYaRNRotaryEmbedding (jquesnelle/yarn 995db5b): with `finetuned`, a
    sequence no longer than max_position_embeddings (= factor x original) uses s = factor, a longer one
    s = seq_len / original_max_position_embeddings; the attention factor is YaRN's for that s."""
    f, L = 4.0, G.original_length

    def repo_scale(seq_len: int) -> float:
        return seq_len / L if seq_len > f * L else f

    for length in (100, L, 3 * L, 4 * L, 4 * L + 1, 10 * L):
        got = compute("dynamic-yarn", G, {"finetuned_factor": f}, length)
        want = compute("yarn", G, {"factor": repo_scale(length)})
        np.testing.assert_allclose(got.inv_freq, want.inv_freq, rtol=1e-14)
        assert got.attention_factor == pytest.approx(want.attention_factor)


# ---------------------------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "spec,fragment",
    [
        ("nope", "unknown method"),
        ("pi:factor=0.5", ">= 1"),
        ("yarn:beta_slow=32,beta_fast=1", "beta_slow"),
        ("yarn:alpha=40", "beta_slow"),
        ("yarn:beta_fast=-3", "> 0"),
        ("pi:beta_fast=3", "does not take"),
        ("yarn:ramp=cubic", "index, ratio"),
        ("yarn:ramp=ratio,truncate=false", "truncate"),
        ("yarn:factor=abc", "number"),
        ("llama3:low_freq_factor=4,high_freq_factor=1", "low_freq_factor"),
        ("ntk:factor=2,alpha=2", "either"),
        ("dynamic-ntk:rule=paper,factor=2", "takes no factor"),
        ("native", "no formula"),
        ("yarn:factor", "NAME:key=value"),
    ],
)
def test_invalid_parameters_are_user_errors(spec, fragment):
    with pytest.raises(CtxevalError, match=fragment):
        for s in expand_specs([spec]):
            compute(s.name, G, s.params)


def test_spec_parsing_and_factor_sweep():
    assert parse_spec("yarn:factor=4,beta_fast=32").params == {"factor": "4", "beta_fast": "32"}
    labels = [s.label for s in expand_specs(["none", "yarn", "pi:factor=3", "dynamic-yarn"], [2, 4])]
    assert labels == ["none", "yarn(factor=2)", "yarn(factor=4)", "pi(factor=3)", "dynamic-yarn"]
    assert expand_specs(["yarn:alpha=2,beta=16"])[0].params == {"beta_slow": 2.0, "beta_fast": 16.0}
    assert [s.label for s in expand_specs(["dynamic-ntk:rule=paper"], [2, 4])] == ["dynamic-ntk(rule=paper)"]


# -- the survivors of mutmut 3.8.1 over rope/methods.py (docs/testing.md): what each method reports beside its frequencies,
# -- the plan, and every one-line refusal

INTERPOLATION_GEOMETRY = Geometry(64, 1e4, 2048)  # _interpolation_factor's default geometry


def _interpolation_factor(name, params, length=None, geom=INTERPOLATION_GEOMETRY):
    return compute(name, geom, params, length).interpolation_factor


def test_interpolation_factor_of_each_method_from_its_definition():
    d, L = 64, 2048
    assert INTERPOLATION_GEOMETRY == Geometry(d, 1e4, L)  # the helper's default: base b = 1e4, so base 4e4 is 4 b
    assert _interpolation_factor("pi", {"factor": 3}) == 3
    assert _interpolation_factor("yarn", {"factor": 3}) == 3
    assert _interpolation_factor("ntk-by-parts", {"factor": 3}) == 3
    assert _interpolation_factor("llama3", {"factor": 3}) == 3
    assert _interpolation_factor("ntk", {"factor": 3}) == pytest.approx(3)  # b' = b s^(d/(d-2)): s back
    assert _interpolation_factor("ntk", {"base": 4e4}) == pytest.approx(4 ** ((d - 2) / d))
    assert _interpolation_factor("dynamic-ntk", {"factor": 2}, 3 * L) == pytest.approx(2 * 3 - 1)  # s l/L - (s-1)
    assert _interpolation_factor("dynamic-ntk", {"rule": "paper"}, 3 * L) == pytest.approx(3)  # max(1, l/L)
    assert _interpolation_factor("dynamic-yarn", {}, 3 * L) == pytest.approx(3)
    factors = {"short_factor": [1.0] * 31 + [1.5], "long_factor": [1.0] * 16 + [4.0] * 16}
    assert (
        _interpolation_factor("longrope", factors, L) == 1.5 and _interpolation_factor("longrope", factors, 2 * L) == 4
    )


def test_plan_rows_for_ntk_pi_and_a_dynamic_method():
    geom = Geometry(64, 1e4, 2048)
    theta = geom.default_inv_freq()
    freqs, rows = plan("ntk", geom, {"factor": 8})
    assert [r.pair for r in rows] == list(range(32))
    assert [r.wavelength for r in rows] == pytest.approx(list(2 * math.pi / theta), rel=1e-12)
    assert [r.ratio for r in rows] == pytest.approx(list(2048 * theta / (2 * math.pi)), rel=1e-12)
    assert [r.inv_freq for r in rows] == list(freqs.inv_freq)
    assert rows[0].group == "extrapolated" and rows[-1].group == "interpolated" and rows[-1].scale == pytest.approx(8)
    assert {r.group for r in rows[1:-1]} == {"blended"}  # NTK scales every other pair by less than s
    assert {r.group for r in plan("pi", geom, {"factor": 2})[1]} == {"interpolated"}  # s = 2 is interpolation too
    _, at_3l = plan(METHODS["dynamic-ntk"], geom, {"factor": 2}, 3 * 2048)  # a Method object, at a length
    assert at_3l[-1].scale == pytest.approx(5) and at_3l[-1].group == "interpolated"
    assert {r.group for r in plan("dynamic-ntk", geom, {"factor": 2})[1]} == {"extrapolated"}  # at L: unchanged


@pytest.mark.parametrize(
    "args, message",
    [
        ((63, 1e4, 64), "rotary dim must be an even number >= 2, got 63"),
        ((0, 1e4, 64), "rotary dim must be an even number >= 2, got 0"),
        ((64, 1.0, 64), "RoPE base must be a finite number > 1, got 1.0"),
        ((64, float("inf"), 64), "RoPE base must be a finite number > 1, got inf"),
        ((64, 1e4, 0), "original length must be >= 1, got 0"),
    ],
)
def test_impossible_geometries_are_refused(args, message):
    with pytest.raises(CtxevalError) as caught:
        Geometry(*args)
    assert str(caught.value) == message


def test_a_base_between_1_and_2_is_a_geometry():
    assert Geometry(64, 1.5, 64).default_inv_freq()[1] == pytest.approx(1.5 ** (-2 / 64))


def test_compute_refuses_a_length_below_one_and_frequencies_that_are_not_positive_and_finite():
    from ctxeval.rope.methods import Method, RopeFreqs

    with pytest.raises(CtxevalError) as caught:
        compute("dynamic-ntk", G, {}, 0)
    assert str(caught.value) == "sequence length must be >= 1, got 0"
    for bad in (np.inf, 0.0, -1.0):
        method = Method("broken", "test", lambda geom, params, length, bad=bad: RopeFreqs(np.array([1.0, bad]), 1.0))
        with pytest.raises(CtxevalError) as caught:
            compute(method, Geometry(4, 1e4, 64), {})
        assert str(caught.value) == (
            "broken with {} gives non-finite or non-positive frequencies for "
            "Geometry(rotary_dim=4, base=10000.0, original_length=64)"
        )


@pytest.mark.parametrize(
    "spec, message",
    [
        (
            "warp",
            "unknown method 'warp' in 'warp'; frequency methods: none, native, pi, linear, ntk, ntk-mixed, dynamic-ntk, "
            "ntk-by-parts, yarn, dynamic-yarn, llama3, longrope; attention methods (alone or after '+'): self-extend, "
            "rerope, leaky-rerope, logn, dca, string, qscale-llama4, qscale-mistral (see 'ctxeval methods')",
        ),
        (
            "yarm",
            "unknown method 'yarm' in 'yarm'; did you mean 'yarn'? frequency methods: none, native, pi, linear, ntk, "
            "ntk-mixed, dynamic-ntk, ntk-by-parts, yarn, dynamic-yarn, llama3, longrope; attention methods (alone or after "
            "'+'): self-extend, rerope, leaky-rerope, logn, dca, string, qscale-llama4, qscale-mistral (see 'ctxeval methods')",
        ),
        (
            "ntk:factor=2+self_extend",
            "unknown method 'self_extend' in 'ntk:factor=2+self_extend'; did you mean "
            "'self-extend'? frequency methods: none, native, pi, linear, ntk, ntk-mixed, dynamic-ntk, "
            "ntk-by-parts, yarn, dynamic-yarn, llama3, longrope; attention methods (alone or after "
            "'+'): self-extend, rerope, leaky-rerope, logn, dca, string, qscale-llama4, qscale-mistral (see 'ctxeval methods')",
        ),
        (
            "native",
            "native is the checkpoint's own RoPE as shipped (e.g. Llama 3.1's llama3 scaling): it has no formula "
            "here; ctxeval reads it back from the model instead",
        ),
        (
            "yarn:beta_fast=4,beta_slow=4",
            "yarn: beta_slow (alpha) must be smaller than beta_fast (beta), got beta_slow=4 "
            "beta_fast=4; the paper uses alpha=1, beta=32",
        ),
        (
            "llama3:low_freq_factor=4,high_freq_factor=4",
            "llama3: low_freq_factor must be smaller than high_freq_factor, got 4 >= 4",
        ),
        (
            "dynamic-ntk:rule=paper,factor=2",
            "dynamic-ntk: rule=paper uses s = max(1, l/L) and takes no factor; drop factor or use rule=transformers",
        ),
        ("ntk:alpha=2,base=20000", "ntk: give either alpha or base, not both"),
        ("ntk:factor=2,base=20000", "ntk: give either factor or base, not both"),
        (
            "yarn:foo=1",
            "method 'yarn' does not take 'foo'; it takes: factor, original_max_position_embeddings, beta_fast, "
            "beta_slow, ramp, truncate, attention_factor, mscale, mscale_all_dim (aliases: alpha=beta_slow, "
            "beta=beta_fast)",
        ),
        ("none:factor=2", "method 'none' does not take 'factor'; it takes: no parameters"),
        ("yarn:alpha=2,beta_slow=2", "yarn: 'beta_slow' given twice (as 'alpha' and 'beta_slow'); keep one"),
        ("yarn:truncate=maybe", "yarn: truncate must be true or false, got 'maybe'"),
        ("yarn:factor=abc", "yarn: factor must be a number, got 'abc'"),
        ("yarn:factor=inf", "yarn: factor must be finite, got 'inf'"),
        (
            "yarn:factor=0.5",
            "yarn: factor must be >= 1, got 0.5 (factor < 1 would shrink the context; use 1 for no scaling)",
        ),
        (
            "ntk:alpha=0.5",
            "ntk: alpha must be >= 1, got 0.5 (factor < 1 would shrink the context; use 1 for no scaling)",
        ),
        ("yarn:mscale=-1", "yarn: mscale must be >= 0, got -1"),
        ("yarn:beta_fast=0", "yarn: beta_fast must be > 0, got 0"),
        (
            "yarn:original_max_position_embeddings=1000.5",
            "yarn: original_max_position_embeddings must be an integer, got '1000.5'",
        ),
        (
            "yarn:original_max_position_embeddings=abc",
            "yarn: original_max_position_embeddings must be an integer, got 'abc'",
        ),
        (
            "longrope:long_factor=1;2",
            "longrope needs short_factor: 64 per-pair factors, e.g. short_factor=@factors.json (a "
            "JSON or TOML file, or a checkpoint's config.json) or short_factor=1.0;1.1;...",
        ),
        (
            "longrope:short_factor=1;abc",
            "longrope: short_factor must be a list of numbers (1.0;1.1;... or @FILE), got '['1', 'abc']'",
        ),
    ],
)
def test_every_refusal_is_one_line_that_says_what_to_do(spec, message):
    with pytest.raises(CtxevalError) as caught:
        for s in expand_specs([spec]):
            compute(s.name, G, s.params)
    assert str(caught.value) == message


@pytest.mark.parametrize(
    "text, value",
    [
        ("true", True),
        ("TRUE", True),
        (" yes ", True),
        ("on", True),
        ("1", True),
        ("false", False),
        ("False", False),
        ("no", False),
        ("OFF", False),
        ("0", False),
    ],
)
def test_boolean_parameters_as_users_write_them(text, value):
    (s,) = expand_specs([f"yarn:factor=4,truncate={text}"])
    expected = compute("yarn", G, {"factor": 4, "truncate": value})
    assert np.array_equal(compute(s.name, G, s.params).inv_freq, expected.inv_freq)
    assert np.array_equal(compute("yarn", G, {"factor": 4, "truncate": text}).inv_freq, expected.inv_freq)


def test_an_integer_parameter_is_an_int():
    from ctxeval.rope.methods import get_method, resolve_params

    params = resolve_params(get_method("yarn"), {"original_max_position_embeddings": "4096"})
    assert (
        params["original_max_position_embeddings"] == 4096 and type(params["original_max_position_embeddings"]) is int
    )
    assert type(resolve_params(get_method("yarn"), {"factor": "4"})["factor"]) is float


def test_factor_lists_from_files_that_are_not_right(tmp_path):
    bad_json, bad_toml = tmp_path / "f.json", tmp_path / "f.toml"
    bad_json.write_text("{not json")
    bad_toml.write_text("short_factor = [1, ")
    cases = [
        (
            f"@{bad_json}",
            f"longrope: short_factor: {bad_json} is not JSON (Expecting property name enclosed in "
            "double quotes at line 1 column 2)",
        ),
        (f"@{bad_toml}", f"longrope: short_factor: {bad_toml} is not valid TOML ("),
        (
            f"@{tmp_path / 'none.json'}",
            f"longrope: short_factor: cannot read {tmp_path / 'none.json'} (No such file or directory)",
        ),
    ]
    empty = tmp_path / "config.json"
    empty.write_text(json.dumps({"rope_scaling": {"long_factor": [1.0] * 64}}))
    cases.append(
        (
            f"@{empty}",
            f"longrope: short_factor: {empty} holds no 'short_factor' (top level, rope_parameters or rope_scaling)",
        )
    )
    for value, message in cases:
        with pytest.raises(CtxevalError) as caught:
            compute("longrope", G, {"short_factor": value, "long_factor": [1.0] * 64})
        assert str(caught.value).startswith(message), str(caught.value)
    nested = tmp_path / "rope.json"  # transformers 5 configs hold them under rope_parameters
    nested.write_text(json.dumps({"rope_parameters": {"short_factor": [2.0] * 64, "long_factor": [3.0] * 64}}))
    got = compute("longrope", G, {"short_factor": f"@{nested}", "long_factor": f"@{nested}"}, 8192)  # past L: long
    assert np.allclose(got.inv_freq, G.default_inv_freq() / 3.0, rtol=1e-12)


def test_longrope_attention_factor_override():
    factors = {"short_factor": [1.0] * 64, "long_factor": [2.0] * 64, "factor": 4}
    assert compute("longrope", G, {**factors, "attention_factor": 1.25}, 4096).attention_factor == 1.25
    assert compute("longrope", G, factors, 4096).attention_factor == pytest.approx(
        math.sqrt(1 + math.log(4) / math.log(G.original_length))
    )
