"""evals/tune/space.py: the search space of each method, snapping, seeds and invalid points."""

from __future__ import annotations

import numpy as np
import pytest

TRAINED, TARGET, S = 128, 256, 2.0  # the tiny model's trained length; the target of every search here; the factor


def tiny_geometry():
    from ctxeval.rope.methods import Geometry

    return Geometry(32, 100000.0, TRAINED)  # ctxeval/tiny/model/config.json: head_dim 32, rope_theta 1e5, 128


def one_spec(text: str):
    from ctxeval.specs import expand_specs

    return expand_specs([text])[0]


def test_yarn_space_searches_betas_and_attention_factor_at_fixed_factor():
    """Bug caught: the factor searched by default (dims gain 'factor'), or fixed at the trained length / target
    (0.125 instead of 8), or a range's log flag dropped."""
    from ctxeval.evals.tune.space import build_space

    space = build_space(one_spec("yarn"), tiny_geometry(), 1024)
    assert space.factor == 1024 / TRAINED == 8.0
    assert space.base.params["factor"] == 8.0
    got = {d.key: (d.kind, d.low, d.high, d.log) for d in space.dims}
    assert got == {
        "beta_fast": (float, 0.5, 128.0, True),
        "beta_slow_ratio": (float, 1 / 1024, 0.9, True),
        "attention_factor": (float, 0.8, 1.6, False),
    }
    assert space.pairs == 16 and not space.vector


def test_a_parameter_fixed_in_the_spec_is_not_searched():
    """Bug caught: `if name not in fixed` dropped: yarn:beta_fast=4 would still search beta_fast (and the trial would
    overwrite the user's 4)."""
    from ctxeval.evals.tune.space import build_space

    space = build_space(one_spec("yarn:beta_fast=4"), tiny_geometry(), 1024)
    assert [d.key for d in space.dims] == ["beta_slow_ratio", "attention_factor"]
    assert space.base.params["beta_fast"] == 4.0
    spec = space.spec({"beta_slow_ratio": 0.125, "attention_factor": 1.1})
    assert spec.params["beta_fast"] == 4.0 and spec.params["factor"] == 8.0 and spec.params["beta_slow"] == 0.5


@pytest.mark.parametrize("target,low,high", [(1024, 4.0, 32.0), (512, 2.0, 16.0)])
def test_ntk_alpha_range_is_relative_to_the_factor(target, low, high):
    """alpha in [s/2, 4s]. Bug caught: per="factor" ignored in _bounds (alpha in [1, 4] at every factor)."""
    from ctxeval.evals.tune.space import build_space

    (dim,) = build_space(one_spec("ntk"), tiny_geometry(), target).dims
    assert (dim.key, dim.low, dim.high, dim.log) == ("alpha", low, high, True)


@pytest.mark.parametrize("trained", [128, 256])
def test_self_extend_neighbor_window_is_relative_to_the_trained_length_and_integer(trained):
    """neighbor_window in [L/16, L], whole numbers; group_size in [2, 64]. Bug caught: scale by the factor instead of
    L (or the target), or the int kind lost (a window of 23.7 positions)."""
    from ctxeval.evals.tune.space import build_space
    from ctxeval.rope.methods import Geometry

    space = build_space(one_spec("yarn+self-extend"), Geometry(32, 100000.0, trained), trained * 8)
    dims = {d.key: d for d in space.dims}
    window, group = dims["self-extend.neighbor_window"], dims["self-extend.group_size"]
    assert (window.kind, window.low, window.high) == (int, trained / 16, trained)
    assert (group.kind, group.low, group.high) == (int, 2, 64)
    snapped = space.snap(
        {
            **{k: (d.low + d.high) / 2 for k, d in dims.items()},
            "self-extend.neighbor_window": 23.7,
            "self-extend.group_size": 4,
        }
    )
    assert snapped["self-extend.neighbor_window"] == 23 and isinstance(snapped["self-extend.neighbor_window"], int)
    spec = space.spec(snapped)
    assert spec.attention[0].params["neighbor_window"] == 23


def test_longrope_has_one_dim_per_pair_in_one_to_one_plus_s():
    """Bug caught: the range [1, s] (LongRoPE's dim_mono range is [1, 1 + s]), or d instead of d/2 factors."""
    from ctxeval.evals.tune.space import build_space

    space = build_space(one_spec("longrope"), tiny_geometry(), 1024)
    assert space.vector and space.pairs == 16
    long = [d for d in space.dims if d.name.startswith("long_factor.")]
    assert [d.key for d in long] == [f"long_factor.{i}" for i in range(16)]
    assert all((d.kind, d.low, d.high) == (float, 1.0, 9.0) for d in long)
    assert space.base.params["short_factor"] == tuple([1.0] * 16)  # plain RoPE up to L unless searched


def test_longrope_searches_its_short_factors_and_start_tokens_unless_fixed():
    """--space short_factor=LOW:HIGH searches the short factors (used up to the trained length) like the long ones,
    non-decreasing; start_token_idx from 0 to an eighth of the trained length (128 here: 16), not when --export asks
    (start_tokens False) or the spec fixes it. Bug caught: spec() writing the long list into short_factor, the start
    tokens searched for an export, or a fixed short_factor searched anyway."""
    from ctxeval.errors import CtxevalError
    from ctxeval.evals.tune.space import build_space, describe, parse_overrides

    ranged = parse_overrides(["short_factor=1:1.5"])
    space = build_space(one_spec("longrope"), tiny_geometry(), 1024, overrides=ranged)
    short = [d for d in space.dims if d.name.startswith("short_factor.")]
    assert [(d.key, d.low, d.high) for d in short] == [(f"short_factor.{i}", 1.0, 1.5) for i in range(16)]
    (start,) = [d for d in space.dims if d.name == "start_token_idx"]
    assert (start.kind, start.low, start.high, start.log) == (int, 0, 16, False)
    point = {f"long_factor.{i}": 2.0 + 0.1 * i for i in range(16)}
    point.update({f"short_factor.{i}": 1.5 - 0.01 * i for i in range(16)})  # decreasing: the running max
    point.update({"attention_factor": 1.1, "start_token_idx": 3})
    spec = space.spec(point)
    assert spec.params["short_factor"] == (1.5,) * 16
    assert spec.params["long_factor"] == tuple(2.0 + 0.1 * i for i in range(16))
    assert spec.params["start_token_idx"] == 3
    assert describe(space).startswith(
        "longrope(factor=8): 16 per-pair long factors in [1, 9] on a 0.01 grid, non-decreasing, 16 per-pair short "
        "factors in [1, 1.5] on a 0.01 grid, non-decreasing, attention_factor in [0.8, 1.6], start_token_idx in [0, 16]"
    )
    # the bounds as labels write them: a study's recorded space stays the same text (resume compares it)
    odd = build_space(one_spec("longrope:factor=2.3333333333333335"), tiny_geometry(), 1024, start_tokens=False)
    assert "16 per-pair long factors in [1, 3.3333333333333335] on a 0.01 grid" in describe(odd)
    exported = build_space(one_spec("longrope"), tiny_geometry(), 1024, start_tokens=False)
    assert "start_token_idx" not in {d.name for d in exported.dims}
    assert "short_factor.0" not in {d.key for d in exported.dims}
    with pytest.raises(CtxevalError, match="the spec fixes"):
        build_space(one_spec("longrope:short_factor=1"), tiny_geometry(), 1024, overrides=ranged)
    with pytest.raises(CtxevalError, match="not a searched parameter"):
        build_space(one_spec("yarn"), tiny_geometry(), 1024, overrides=parse_overrides(["short_factor=1:2"]))
    fixed = build_space(one_spec("longrope:short_factor=1,start_token_idx=2"), tiny_geometry(), 1024)
    assert {d.name.split(".")[0] for d in fixed.dims} == {"long_factor", "attention_factor"}
    assert fixed.spec({**point}).params["short_factor"] == (1.0,) * 16
    assert fixed.spec({**point}).params["start_token_idx"] == 2


def test_monotone_is_the_running_max():
    """Bug caught: np.minimum.accumulate, or sorting (which moves values between pairs)."""
    from ctxeval.evals.tune.space import monotone

    assert monotone([1.0, 3.0, 2.0, 5.0, 4.0, 4.5]) == (1.0, 3.0, 3.0, 5.0, 5.0, 5.0)
    assert monotone([2.0, 1.0]) == (2.0, 2.0)


def test_snap_rounds_longrope_to_the_grid_and_other_floats_to_four_digits():
    """Bug caught: round(value, 2) applied to every float (beta_slow 0.0123 -> 0.01), or '.4f' instead of '.4g'."""
    from ctxeval.evals.tune.space import build_space

    yarn = build_space(one_spec("yarn"), tiny_geometry(), 1024)
    assert yarn.snap({"beta_fast": 12.34567, "beta_slow_ratio": 0.0123456, "attention_factor": 1.23456}) == {
        "beta_fast": 12.35,
        "beta_slow_ratio": 0.01235,
        "attention_factor": 1.235,
    }
    assert yarn.snap({"beta_fast": 1e9, "beta_slow_ratio": 1e-9, "attention_factor": 1.0})["beta_fast"] == 128.0
    ranged = {"short_factor": (1.0, 9.0, False)}
    longrope = build_space(one_spec("longrope"), tiny_geometry(), 1024, overrides=ranged)
    point = {f"{name}.{i}": 1.0 + i * 0.5123 for name in ("long_factor", "short_factor") for i in range(16)}
    point["long_factor.15"] = 9.004  # rounds onto the range's top
    point["start_token_idx"] = 3
    if "attention_factor" in {d.key for d in longrope.dims}:
        point["attention_factor"] = 1.23456
    snapped = longrope.snap(point)
    assert [snapped[f"long_factor.{i}"] for i in range(15)] == [round(1.0 + i * 0.5123, 2) for i in range(15)]
    assert snapped["long_factor.15"] == 9.0
    assert snapped["short_factor.3"] == round(1.0 + 3 * 0.5123, 2) and snapped["start_token_idx"] == 3
    if "attention_factor" in snapped:
        assert snapped["attention_factor"] == 1.235


def test_spec_of_an_invalid_point_raises():
    """Bug caught: spec() skips resolve_params (beta_slow >= beta_fast would be measured as a method). With beta_slow
    searched as given (--space beta_slow=...), the method's own check refuses a ramp upside down."""
    from ctxeval.errors import CtxevalError
    from ctxeval.evals.tune.space import build_space

    space = build_space(one_spec("yarn"), tiny_geometry(), 1024, overrides={"beta_slow": (0.01, 16.0, True)})
    assert [d.key for d in space.dims] == ["beta_fast", "beta_slow", "attention_factor"]
    for slow in (2.0, 3.0):
        with pytest.raises(CtxevalError, match="beta"):
            space.spec({"beta_fast": 2.0, "beta_slow": slow, "attention_factor": 1.0})
    spec = space.spec({"beta_fast": 4.0, "beta_slow": 0.25, "attention_factor": 1.1})
    assert (spec.name, spec.params) == (
        "yarn",
        {"factor": 8.0, "beta_fast": 4.0, "beta_slow": 0.25, "attention_factor": 1.1},
    )


@pytest.mark.parametrize("ratio", [1 / 1024, 0.0625, 0.9])
def test_beta_slow_searched_as_a_ratio_is_never_a_refused_ramp(ratio):
    """beta_slow = ratio x beta_fast (4 significant digits), at the ratio range's ends and inside, at the smallest and
    largest beta_fast: every point is a method. Bug caught: the ratio used as beta_slow itself (0.9 at beta_fast 0.5
    is refused), or divided instead of multiplied."""
    from ctxeval.evals.tune.space import build_space

    space = build_space(one_spec("yarn"), tiny_geometry(), 1024)
    for fast in (0.5, 4.0, 128.0):
        spec = space.spec({"beta_fast": fast, "beta_slow_ratio": ratio, "attention_factor": 1.0})
        assert spec.params["beta_slow"] == pytest.approx(fast * ratio, rel=1e-3)
        assert spec.params["beta_slow"] < spec.params["beta_fast"]


def test_a_ratio_range_reaching_one_is_refused():
    """Bug caught: --space beta_slow_ratio=0.1:1 accepted (its top is a ramp YaRN refuses)."""
    from ctxeval.errors import CtxevalError
    from ctxeval.evals.tune.space import build_space

    with pytest.raises(CtxevalError, match="below 1"):
        build_space(one_spec("yarn"), tiny_geometry(), 1024, overrides={"beta_slow_ratio": (0.1, 1.0, False)})
    space = build_space(one_spec("yarn"), tiny_geometry(), 1024, overrides={"beta_slow_ratio": (0.1, 0.5, False)})
    assert {d.key: (d.low, d.high) for d in space.dims}["beta_slow_ratio"] == (0.1, 0.5)


@pytest.mark.parametrize(
    "geometry,want",
    [
        ((128, 10000.0, 4096), (32.0, 1.0)),  # Llama 2, where YaRN chose 32 / 1: unchanged
        ((32, 100000.0, 128), (0.5632, 0.009095)),  # the bundled model
        ((64, 100000.0, 8192), (31.98, 0.4501)),  # SmolLM2
    ],
)
def test_betas_scaled_to_the_geometry_cut_the_pairs_where_yarns_cut_llama_2(geometry, want):
    """Brute force: a pair's rotations over L, r_i = L theta_i / 2 pi; on Llama 2, 32 and 1 sit at fractions
    u = log(r_0 / beta) / log(r_0 / r_last) of the log range; on another model beta = r_0 (r_last / r_0)^u. Bug caught:
    the model's trained length or base ignored, or the two ends swapped."""
    import math

    from ctxeval.evals.tune.space import scaled_betas
    from ctxeval.rope.methods import Geometry

    def rotations(d, base, length):
        return [length * base ** (-2 * i / d) / (2 * math.pi) for i in range(d // 2)]

    ref = rotations(128, 10000.0, 4096)
    mine = rotations(*geometry)
    brute = []
    for beta in (32.0, 1.0):
        u = math.log(ref[0] / beta) / math.log(ref[0] / ref[-1])
        brute.append(mine[0] * (mine[-1] / mine[0]) ** u)
    got = scaled_betas(Geometry(*geometry), geometry[2])
    assert got == pytest.approx(brute, rel=1e-3) and got == pytest.approx(want, rel=1e-3)


def test_longrope_seeds_are_pi_ntk_and_yarn_factors():
    """pi = s for every pair; ntk = s^(2i/(d-2)); yarn = s (1 - gamma) + gamma, gamma = YaRN's ramp at beta 32 / 1
    (1 extrapolates, 0 interpolates); each clipped to [1, 1 + s]. Bug caught: the ntk exponent 2i/d (last pair
    s^(15/16) instead of s), or gamma and 1 - gamma swapped (factors decreasing from s to 1)."""
    from ctxeval.evals.tune.space import build_space, longrope_seeds
    from ctxeval.rope.methods import yarn_ramp

    geometry = tiny_geometry()
    s, d = 8.0, 32
    space = build_space(one_spec("longrope"), geometry, 1024)
    seeds = longrope_seeds(space, geometry)
    i = np.arange(d // 2, dtype=np.float64)
    gamma = yarn_ramp(geometry, {"beta_fast": 32.0, "beta_slow": 1.0, "ramp": "index", "truncate": True}, TRAINED)
    want = {
        "pi": np.full(d // 2, s),
        "ntk": np.clip(s ** (2 * i / (d - 2)), 1, 1 + s),
        "yarn": np.clip(s * (1 - gamma) + gamma, 1, 1 + s),
    }
    assert set(seeds) == set(want)
    for name, factors in want.items():
        np.testing.assert_allclose(seeds[name], factors, rtol=1e-12, err_msg=name)
    assert seeds["ntk"][0] == 1.0 and seeds["ntk"][-1] == pytest.approx(s)
    assert seeds["yarn"][0] == 1.0 and seeds["yarn"][-1] == s  # the fastest pair extrapolates, the slowest is s
    assert all(np.all(np.diff(v) >= 0) for v in seeds.values())


def test_factor_is_rounded_as_every_command_rounds_it_and_ntk_searches_no_second_factor():
    """Bug caught: the exact target / trained ratio (7.8125 for 1000 / 128) while --compare specs get default_factor's
    7.82; or --search-factor adding a factor next to ntk's alpha (every point refused by ntk's checks)."""
    from ctxeval.evals.tune.space import build_space
    from ctxeval.specs import default_factor

    space = build_space(one_spec("yarn"), tiny_geometry(), 1000)
    assert space.factor == default_factor(1000, 128) == 7.82 and space.base.params["factor"] == 7.82
    ntk = build_space(one_spec("ntk"), tiny_geometry(), 1024, search_factor=True)
    assert [d.key for d in ntk.dims] == ["alpha"]


def test_ntk_mixed_searches_its_exponent_around_vllms_one():
    """mixed_b in [0.25, 4] on a log scale (1 = vLLM's plain ntk in the middle). Bug caught: ntk-mixed missing from
    RANGES (then only --search-factor would search anything) or the log flag dropped."""
    from ctxeval.evals.tune.space import build_space

    space = build_space(one_spec("ntk-mixed"), tiny_geometry(), 1024)
    assert [(d.key, d.low, d.high, d.log) for d in space.dims] == [("mixed_b", 0.25, 4.0, True)]
    assert space.spec({"mixed_b": 0.625}).resolved == {"factor": 8.0, "mixed_b": 0.625}


@pytest.mark.parametrize(
    "text, bounds",
    [
        ("dca", {"dca.chunk_size": (4096, 8192), "dca.local_size": (128, 2048)}),
        ("string", {"string.shift": (820, 4915), "string.local": (8, 512)}),
        ("yarn+dca:local_size=512", {"dca.chunk_size": (4096, 8192)}),
    ],
)
def test_dca_and_string_search_sizes_relative_to_the_trained_length(text, bounds):
    """Bugs caught: a range taken in tokens instead of per length; a size the user fixed searched anyway; a point
    where local >= chunk measured instead of refused."""
    from ctxeval.errors import CtxevalError
    from ctxeval.evals.tune.space import build_space
    from ctxeval.rope.methods import Geometry

    space = build_space(one_spec(text), Geometry(64, 10000.0, 8192), 32768)
    found = {d.key: (d.low, d.high) for d in space.dims if d.owner}
    assert found == bounds and all(d.kind is int for d in space.dims if d.owner)
    if text == "dca":
        with pytest.raises(CtxevalError, match="chunk_size .* must be larger than local_size"):
            space.spec({"dca.chunk_size": 1000, "dca.local_size": 1000})
        assert space.spec({"dca.chunk_size": 6144, "dca.local_size": 1024}).attention[0].params["chunk_size"] == 6144


@pytest.mark.parametrize(
    "text, fixed, searched",
    [
        ("yarn+self-extend:group_size=4", ("self-extend", "group_size", 4), {"self-extend.neighbor_window"}),
        ("pi+self-extend:neighbor_window=64", ("self-extend", "neighbor_window", 64), {"self-extend.group_size"}),
        ("leaky-rerope:k=8", ("leaky-rerope", "k", 8.0), {"leaky-rerope.window"}),
        ("string:local=8", ("string", "local", 8), {"string.shift"}),
    ],
)
def test_a_parameter_fixed_on_an_attention_method_is_not_searched_and_every_trial_keeps_it(text, fixed, searched):
    """self-extend:group_size=4 searched is measured at the sampler's group size, not the user's 4. Bugs caught:
    `if name not in a.given` dropped in build_space (the fixed value becomes a dim, its trials overwrite it), or
    SearchSpace.spec starting an attention method from no parameters instead of the given ones."""
    from ctxeval.evals.tune.space import build_space

    owner, name, value = fixed
    space = build_space(one_spec(text), tiny_geometry(), 1024)
    assert {d.key for d in space.dims if d.owner} == searched
    for fraction in (0.0, 0.5, 1.0):  # the searched dims' low end, middle and high end
        point = {d.key: d.low + fraction * (d.high - d.low) for d in space.dims}
        spec = space.spec(space.snap(point))
        (attention,) = [a for a in spec.attention if a.name == owner]
        assert attention.params[name] == value
        assert f"{name}={value:g}" in spec.label
