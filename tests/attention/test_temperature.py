"""Query temperature (ctxeval/attention/temperature.py): Llama 4's attn_temperature_tuning and Mistral's
llama_4_scaling_beta as attention methods on the query-scale kernel, and the read-back that measures the q scale a
model applies. Checked against transformers' own Llama4 and Ministral3 classes on tiny random models, an independent
per-position brute force, and the invariants (1 below the floor)."""

import math

import pytest
import torch
from helpers import tiny_llama
from transformers import Llama4ForCausalLM, Llama4TextConfig, Ministral3Config, Ministral3ForCausalLM

from ctxeval.attention.kernels import choose_kernel
from ctxeval.attention.methods import noop_reason
from ctxeval.attention.patching import attention_methods, kernel_of, verify_attention_methods
from ctxeval.attention.temperature import (
    capture_sdpa,
    llama4_scale,
    mistral_scale,
    nope_layers,
    query_scale_record,
)
from ctxeval.errors import CtxevalError
from ctxeval.rope.patching import find_rotary_modules
from ctxeval.specs import parse_spec

SIZES = dict(
    vocab_size=64,
    hidden_size=32,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=64,
    rms_norm_eps=1e-5,
    initializer_range=0.2,  # weights large enough that a q scale moves the logits
)


def llama4(tuning=True, floor_scale=4, attn_scale=0.5):
    """A tiny random Llama 4 text model (layer 3 of 4 without RoPE, as Llama 4's every fourth)."""
    torch.manual_seed(0)
    config = Llama4TextConfig(
        **SIZES,
        intermediate_size=32,
        intermediate_size_mlp=32,
        num_hidden_layers=4,
        num_local_experts=2,
        num_experts_per_tok=1,
        attention_chunk_size=None,
        attn_temperature_tuning=tuning,
        floor_scale=floor_scale,
        attn_scale=attn_scale,
        attn_implementation="sdpa",
    )
    return Llama4ForCausalLM(config).eval()


def ministral3(beta=0.5, original=5):
    torch.manual_seed(0)
    rope = {
        "rope_type": "default",
        "rope_theta": 10000.0,
        "llama_4_scaling_beta": beta,
        "original_max_position_embeddings": original,
    }
    config = Ministral3Config(
        **SIZES, intermediate_size=48, num_hidden_layers=2, sliding_window=None, rope_parameters=rope,
        attn_implementation="sdpa",
    )  # fmt: skip
    return Ministral3ForCausalLM(config).eval()


def llama_like(model):
    """A plain Llama with the same sizes and weights as `model` (Ministral3 without its sliding window)."""
    llama = tiny_llama(
        **SIZES, intermediate_size=model.config.intermediate_size, num_hidden_layers=model.config.num_hidden_layers
    )
    llama.config._attn_implementation = "sdpa"
    missing = llama.load_state_dict(model.state_dict(), strict=True)
    assert not missing.missing_keys
    return llama


def brute_llama4(p, attn_scale, floor_scale):
    return 1 + attn_scale * math.log(((p + 1) // floor_scale) + 1)


def brute_mistral(p, beta, original):
    return 1 + beta * math.log(1 + p // original)


def queries_seen(model, ids, specs=(), original=64):
    """Every query handed to torch's sdpa in one forward, in call order (one per layer)."""
    seen = []
    inv_freq = find_rotary_modules(model)[0][1].inv_freq
    with torch.inference_mode(), attention_methods(model, specs, lambda: inv_freq, original), capture_sdpa(seen):
        logits = model(input_ids=ids).logits
    return [q for q, _ in seen], logits


IDS = (torch.arange(3, 24) % 64)[None]  # 21 tokens: positions 0..20


@pytest.mark.parametrize("attn_scale,floor_scale", [(0.1, 8192), (0.5, 4), (0.3, 7), (1.0, 2)])
def test_llama4_scale_equals_a_brute_force_and_is_one_below_its_floor(attn_scale, floor_scale):
    positions = torch.arange(0, 5 * floor_scale + 3) if floor_scale < 100 else torch.tensor([0, 8190, 8191, 16383])
    got = llama4_scale(positions, attn_scale, floor_scale)
    want = [brute_llama4(int(p), attn_scale, floor_scale) for p in positions]
    assert got.tolist() == pytest.approx(want, abs=1e-15)
    below = llama4_scale(torch.arange(floor_scale - 1), attn_scale, floor_scale)
    assert torch.equal(below, torch.ones_like(below))  # exactly 1, not close to it
    assert float(llama4_scale(torch.tensor([floor_scale - 1]), attn_scale, floor_scale)[0]) > 1  # (p + 1), not p


@pytest.mark.parametrize("beta,original", [(0.1, 16384), (0.5, 5), (0.2, 3)])
def test_mistral_scale_equals_a_brute_force_and_starts_at_original(beta, original):
    positions = torch.arange(0, 4 * original + 2) if original < 100 else torch.tensor([0, 16383, 16384, 32768])
    got = mistral_scale(positions, beta, original)
    assert got.tolist() == pytest.approx([brute_mistral(int(p), beta, original) for p in positions], abs=1e-15)
    below = mistral_scale(torch.arange(original), beta, original)
    assert torch.equal(below, torch.ones_like(below))
    assert float(mistral_scale(torch.tensor([original]), beta, original)[0]) > 1  # p, not p + 1


def test_native_llama4_read_back_equals_what_transformers_applies():
    model = llama4()
    record = query_scale_record(model, (), 16, native=True)
    assert record["config_ships"] == {
        "name": "qscale-llama4",
        "params": {"attn_scale": 0.5, "floor_scale": 4, "layers": "nope"},
    }
    assert record["matches"] and record["max_diff_in_tolerances"] <= 1
    assert nope_layers(model) == [3]
    by_layer = {row["layer"]: row["q_scale"] for row in record["layers"]}
    for p, got in zip(record["positions"], by_layer[3]):
        assert got == pytest.approx(brute_llama4(p, 0.5, 4), rel=1e-6)
    assert all(v == pytest.approx(1, abs=1e-6) for layer in (0, 1, 2) for v in by_layer[layer])
    # transformers' own forward, probed: layer 3's q over the same tokens with and without the tuning (layers 0-2 are
    # identical, so layer 3's input is too): their ratio is the scale ctxeval read back
    tuned, _ = queries_seen(model, IDS)
    for module in model.modules():
        if hasattr(module, "attn_temperature_tuning"):
            module.attn_temperature_tuning = False
    plain, _ = queries_seen(model, IDS)
    ratio = (tuned[3][0].double().norm(dim=-1) / plain[3][0].double().norm(dim=-1)).mean(0)  # (T,)
    assert ratio.tolist() == pytest.approx([brute_llama4(p, 0.5, 4) for p in range(IDS.shape[1])], rel=1e-6)
    assert record["softmax_scale"] == [1.0]
    assert record["summary"] == (
        "layers 0-2: q x1 at every position probed (0-127); layer 3: q x1.347 from position 3 (x1 at 2) to x2.748 "
        "at 127; softmax scale x1 of 1/sqrt(head_dim)"
    )
    from ctxeval.report.html import methods_html

    page = methods_html({"native": {"method": "native", "query_scale": record}}, "m")
    assert "layer 3: q x1.347 from position 3" in page and "relative_to_position" not in page


def test_native_ministral3_read_back_equals_what_transformers_applies():
    model = ministral3(beta=0.5, original=5)
    record = query_scale_record(model, (), 64, native=True)
    assert record["config_ships"]["params"] == {"beta": 0.5, "original": 5, "layers": "all"}
    assert record["matches"]
    for row in record["layers"]:
        assert row["q_scale"] == pytest.approx([brute_mistral(p, 0.5, 5) for p in record["positions"]], rel=1e-6)
    assert 5 in record["positions"] and 4 in record["positions"]  # the boundary is probed


def test_native_plain_llama_reads_back_no_q_scale_and_the_softmax_scale_it_runs():
    from ctxeval.attention.patching import attention_temperature

    model = tiny_llama(attn_implementation="sdpa")
    record = query_scale_record(model, (), 64, native=True)
    assert record["config_ships"] is None and record["matches"]
    assert all(v == pytest.approx(1, abs=1e-6) for row in record["layers"] for v in row["q_scale"])
    assert record["softmax_scale"] == [1.0]
    with attention_temperature(model, 1.5):  # logits x 1.5 through the modules' scaling: seen at the sdpa call
        hot = query_scale_record(model, (), 64, native=True)
    assert hot["softmax_scale"] == [1.5] and hot["summary"].endswith("softmax scale x1.5 of 1/sqrt(head_dim)")


def test_mistral_form_on_a_plain_llama_equals_ministral3():
    """Ministral3 without its sliding window is a Llama with the Mistral scale: same weights, same logits."""
    mistral = ministral3(beta=0.5, original=5)
    llama = llama_like(mistral)
    with torch.inference_mode():
        want = mistral(input_ids=IDS).logits
        plain = llama(input_ids=IDS).logits
    spec = parse_spec("qscale-mistral:beta=0.5,original=5").attention
    queries, got = queries_seen(llama, IDS, spec)
    assert (want - plain).abs().max() > 1e-3  # the scale matters at these positions
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
    mistral_queries, _ = queries_seen(mistral, IDS)
    for ours, theirs in zip(queries, mistral_queries):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


def test_mistral_form_read_back_on_a_llama_equals_ministral3s_own():
    mistral = ministral3(beta=0.5, original=5)
    llama = llama_like(mistral)
    spec = parse_spec("qscale-mistral:beta=0.5,original=5").attention
    native = query_scale_record(mistral, (), 64, native=True)
    inv_freq = find_rotary_modules(llama)[0][1].inv_freq
    with attention_methods(llama, spec, lambda: inv_freq, 64):
        ours = query_scale_record(llama, spec, 64)
        check = verify_attention_methods(llama, spec, lambda: inv_freq, 64)
    assert ours["positions"] == native["positions"]
    for a, b in zip(ours["layers"], native["layers"]):
        assert a["q_scale"] == pytest.approx(b["q_scale"], rel=1e-6)
    assert ours["max_diff_in_tolerances"] <= 1
    assert check["attention_kernel"] == "query-scale"


def test_llama4_form_on_llama4_without_its_tuning_equals_llama4_with_it():
    tuned, bare = llama4(tuning=True), llama4(tuning=False)
    with torch.inference_mode():
        want = tuned(input_ids=IDS).logits
        untuned = bare(input_ids=IDS).logits
    spec = parse_spec("qscale-llama4:attn_scale=0.5,floor_scale=4").attention  # layers=nope by default
    _, got = queries_seen(bare, IDS, spec)
    assert (want - untuned).abs().max() > 1e-3
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
    _, every_layer = queries_seen(
        bare, IDS, parse_spec("qscale-llama4:attn_scale=0.5,floor_scale=4,layers=all").attention
    )
    assert (every_layer - want).abs().max() > 1e-3  # layers=all is another model
    inv_freq = find_rotary_modules(bare)[0][1].inv_freq
    with attention_methods(bare, spec, lambda: inv_freq, 64):  # the probe runs on a layer the method scales (3)
        check = verify_attention_methods(bare, spec, lambda: inv_freq, 64)
    assert check["max_abs_diff_vs_reference"] < 1e-5 and check["layers_running_it"] == 4


def test_the_probe_leaves_a_dynamic_rope_as_it_found_it():
    model = tiny_llama(
        rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}, attn_implementation="sdpa"
    )
    rotary = find_rotary_modules(model)[0][1]
    before = {"inv_freq": rotary.inv_freq.clone(), "numbers": dict(vars(rotary))}
    with torch.inference_mode():
        want = model(input_ids=IDS).logits
    record = query_scale_record(model, (), 64, native=True)
    assert max(record["positions"]) > 64  # probed past the trained length, where dynamic NTK changes frequencies
    assert torch.equal(rotary.inv_freq, before["inv_freq"])
    assert {k: v for k, v in vars(rotary).items() if isinstance(v, (int, float))} == {
        k: v for k, v in before["numbers"].items() if isinstance(v, (int, float))
    }
    with torch.inference_mode():
        torch.testing.assert_close(model(input_ids=IDS).logits, want, atol=0, rtol=0)


def test_read_back_catches_a_model_that_does_not_apply_the_scale():
    llama = tiny_llama(attn_implementation="sdpa")
    spec = parse_spec("qscale-mistral:beta=0.5,original=5").attention
    with pytest.raises(CtxevalError, match="differs from the formula"):
        query_scale_record(llama, spec, 64)  # the method is not installed: the model applies no scale


def test_read_back_is_none_without_a_query_temperature():
    assert query_scale_record(tiny_llama(attn_implementation="sdpa"), parse_spec("logn").attention, 64) is None


def test_layers_nope_refused_on_a_model_without_nope_layers():
    llama = tiny_llama(attn_implementation="sdpa")
    spec = parse_spec("qscale-mistral:layers=nope").attention
    with pytest.raises(CtxevalError, match="layers=nope") as err:
        with attention_methods(llama, spec, lambda: None, 64):
            pass
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("forced", ["", "chunked"])
def test_query_temperatures_run_on_the_query_scale_path(monkeypatch, forced):
    monkeypatch.setenv("CTXEVAL_ATTENTION_KERNEL", forced)
    for text in ("qscale-llama4", "qscale-mistral:beta=0.2", "yarn:factor=2+qscale-mistral"):
        assert choose_kernel(parse_spec(text).attention, "cpu") == "query-scale"
    llama = tiny_llama(attn_implementation="sdpa")
    spec = parse_spec("qscale-mistral:beta=0.5,original=5").attention
    assert kernel_of(llama, spec) == "query-scale"
    queries, _ = queries_seen(llama, IDS, spec)  # the model's own sdpa ran, once per layer
    assert len(queries) == 2


@pytest.mark.parametrize(
    "text,needle",
    [
        ("qscale-mistral+self-extend", "a query temperature"),
        ("qscale-llama4+logn", "a query temperature"),
        ("rerope+qscale-mistral", "a query temperature"),
        ("qscale-llama4:layers=some", "must be one of all, nope"),
        ("qscale-llama4:floor_scale=1", "floor_scale"),
        ("qscale-mistral:beta=0", "beta"),
        ("qscale-mistral:original=0", "original"),
    ],
)
def test_bad_specs_are_one_line_errors(text, needle):
    with pytest.raises(CtxevalError, match=needle) as err:
        parse_spec(text)
    assert "\n" not in str(err.value)


def test_noop_below_the_first_scaled_position():
    llama4_spec = parse_spec("qscale-llama4:floor_scale=8").attention
    assert noop_reason(llama4_spec, [7], 64) is not None  # positions 0..6: (p + 1) // 8 == 0
    assert noop_reason(llama4_spec, [8], 64) is None  # position 7: (7 + 1) // 8 == 1
    mistral_spec = parse_spec("qscale-mistral").attention  # original = the trained length, 64
    assert noop_reason(mistral_spec, [64], 64) is not None
    assert noop_reason(mistral_spec, [65], 64) is None


def test_tune_searches_the_temperatures_coefficient():
    from ctxeval.evals.tune.space import build_space
    from ctxeval.rope.methods import Geometry
    from ctxeval.specs import expand_specs

    geometry = Geometry(16, 10000.0, 64)
    (spec,) = expand_specs(["yarn:factor=2,beta_fast=4,beta_slow=1+qscale-mistral"])
    space = build_space(spec, geometry, 128)
    assert [d.key for d in space.dims if d.owner] == ["qscale-mistral.beta"]
    point = {d.key: (d.low * d.high) ** 0.5 for d in space.dims}
    made = space.spec(space.snap(point))
    assert made.attention[0].params["beta"] == pytest.approx(0.1, rel=1e-3)
    (fixed,) = expand_specs(["yarn:factor=2,beta_fast=4,beta_slow=1+qscale-llama4:attn_scale=0.2"])
    assert not [d for d in build_space(fixed, geometry, 128).dims if d.owner]


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["-m", "qscale-llama4:floor_scale=32"], "layers=nope scales the layers whose RoPE is off"),
        (["-m", "qscale-mistral", "--attn", "eager"], "read back at the sdpa call, and this model runs 'eager'"),
    ],
)
def test_cli_refuses_what_the_model_cannot_take_before_the_run_directory(tmp_path, extra, needle):
    from typer.testing import CliRunner

    from ctxeval.cli import app

    out = tmp_path / "r"
    args = ["ppl", "--model", "tiny", "--device", "cpu", "--lengths", "128", "--out", str(out)]
    result = CliRunner().invoke(app, [*args, "-m", "none", *extra])
    assert result.exit_code == 2 and not out.exists(), result.output
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert needle in line


def test_cli_records_the_measured_q_scale_in_run_json(tmp_path):
    import json

    from typer.testing import CliRunner

    from ctxeval.cli import app

    out = tmp_path / "r"
    args = ["ppl", "--model", "tiny", "--device", "cpu", "--lengths", "128", "--out", str(out), "--docs", "1"]
    result = CliRunner().invoke(app, [*args, "-m", "native", "-m", "qscale-mistral:beta=0.3,original=64"])
    assert result.exit_code == 0, result.output
    methods = json.loads((out / "run.json").read_text())["methods"]
    native = methods["native"]["query_scale"]
    assert native["config_ships"] is None and native["matches"]
    ours = methods["qscale-mistral(beta=0.3,original=64)"]["query_scale"]
    at = ours["positions"].index(128)
    assert all(row["q_scale"][at] == pytest.approx(brute_mistral(128, 0.3, 64), rel=1e-6) for row in ours["layers"])
    assert ours["compared_to"] == [{"name": "qscale-mistral", "params": {"beta": 0.3, "original": 64, "layers": "all"}}]


@pytest.mark.parametrize("family", ["llama4", "ministral3"])
def test_cli_native_on_a_checkpoint_that_ships_a_temperature_records_the_measured_scale(tmp_path, family):
    """-m native on a saved Llama 4 / Ministral 3: transformers applies the temperature, run.json records it measured,
    with what the config ships, and (Llama 4's complex rotary output) the RoPE read back."""
    import json

    from helpers import build_tokenizer
    from typer.testing import CliRunner

    from ctxeval.cli import app

    tok = build_tokenizer()
    model = llama4(floor_scale=16) if family == "llama4" else ministral3(beta=0.5, original=16)
    model.resize_token_embeddings(len(tok), mean_resizing=False)
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    out = tmp_path / "r"
    args = ["ppl", "--model", str(tmp_path / "model"), "--device", "cpu", "--lengths", "48", "--docs", "1"]
    result = CliRunner().invoke(app, [*args, "-m", "native", "--out", str(out)])
    assert result.exit_code == 0, result.output
    native = json.loads((out / "run.json").read_text())["methods"]["native"]
    record = native["query_scale"]
    assert record["config_ships"]["name"] == f"qscale-{'llama4' if family == 'llama4' else 'mistral'}"
    assert record["matches"] and record["max_diff_in_tolerances"] <= 1
    formula = (lambda p: brute_llama4(p, 0.5, 16)) if family == "llama4" else (lambda p: brute_mistral(p, 0.5, 16))
    scaled = [row for row in record["layers"] if family == "ministral3" or row["layer"] == 3]
    assert len(scaled) == (1 if family == "llama4" else 2)
    for row in scaled:
        assert row["q_scale"] == pytest.approx([formula(p) for p in record["positions"]], rel=1e-6)
    inv_freq = find_rotary_modules(model)[0][1].inv_freq.double()
    assert native["effective"][0]["inv_freq_readback"] == pytest.approx(inv_freq.tolist(), rel=1e-6)


def test_plan_shows_the_temperature_and_where_it_starts():
    from typer.testing import CliRunner

    from ctxeval.cli import app

    for text, line in [
        ("qscale-mistral", "1 + 0.1 ln(1 + floor(i/128)) on every layer; exactly 1 below i = 128"),
        (
            "yarn:factor=2+qscale-llama4:floor_scale=64",
            "ln(floor((i+1)/64) + 1) on the layers whose RoPE is off; exactly 1 below i = 63",
        ),
    ]:
        result = CliRunner().invoke(app, ["plan", "--model", "tiny", "-m", text])
        assert result.exit_code == 0, result.output
        assert line in " ".join(result.stdout.split())


def test_native_reads_any_attention_that_knows_its_layer_and_says_why_not_otherwise():
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(0)
    config = GPTNeoXConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, rotary_pct=0.5
    )
    config._attn_implementation = "sdpa"
    neox = GPTNeoXForCausalLM(config).eval()  # partial rotary, fused qkv projection
    record = query_scale_record(neox, (), 64, native=True)
    assert record["matches"] and len(record["layers"]) == 2
    assert record["summary"].startswith("layers 0-1: q x1 at every position probed (0-511)")
    with attention_methods(neox, parse_spec("qscale-mistral:beta=0.5,original=5").attention, lambda: None, 64):
        scaled = query_scale_record(neox, (), 64, native=True)  # native: compared with no temperature
    assert not scaled["matches"] and scaled["layers"][1]["q_scale"][-1] == pytest.approx(brute_mistral(511, 0.5, 5))
    neox.config._attn_implementation = "eager"
    assert query_scale_record(neox, (), 64, native=True) == {
        "measured": False,
        "why": "the q scale is read through sdpa; this model runs 'eager'",
        "config_ships": None,
    }
    with pytest.raises(CtxevalError, match="read back at the sdpa call, and this model runs 'eager'"):
        query_scale_record(neox, parse_spec("qscale-mistral").attention, 64)
