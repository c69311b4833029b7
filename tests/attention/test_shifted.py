"""Dual Chunk Attention and STRING (ctxeval/attention/shifted.py): an independent brute force that builds every
(query, key) pair's positions from the papers' rules, the invariants, in-model probes and one-line refusals.
(The original code, transcribed: tests/conformance/test_dca_string.py.)"""

import math

import pytest
import torch
from helpers import tiny_llama, tiny_neox

from ctxeval.attention.methods import (
    change_points,
    check_sizes,
    in_effect,
    noop_reason,
    relative_position,
    resolve_attention,
    rotate,
)
from ctxeval.attention.patching import attention_methods, attention_temperature, verify_attention_methods
from ctxeval.attention.shifted import attend_shifted, fused_shifted
from ctxeval.errors import CtxevalError
from ctxeval.rope.patching import find_rotary_modules
from ctxeval.specs import expand_specs


def brute_force(q_raw, k_raw, v, inv_freq, name, params, trained, prefill):
    """Per pair (i, j), float64: its positions under each rule that scores it (DCA: one of intra / successive /
    inter chunk; STRING: near and/or shifted), q and k rotated there, one softmax over every scored term."""
    heads, tq, dim = q_raw.shape
    tk, rd = k_raw.shape[1], 2 * inv_freq.numel()
    n = tk  # the sequence's length (positions 0 .. tk - 1)

    def rope_at(x, p):
        angle = p * inv_freq.double()
        angle = torch.cat((angle, angle))
        head, half = x[:rd], rd // 2
        turned = torch.cat((-head[half:], head[:half]))
        return torch.cat((head * angle.cos() + turned * angle.sin(), x[rd:]))

    out = torch.zeros(tq, heads, dim, dtype=torch.float64)
    for h in range(heads):
        for a in range(tq):
            i = tk - tq + a
            terms = []
            for j in range(i + 1):
                q, k = q_raw[h, a].double().clone(), k_raw[h, j].double().clone()
                logit = 1.0
                if name == "dca":
                    chunk, local = params["chunk_size"], params["local_size"]
                    c = chunk - local
                    if i // c == j // c:
                        pairs = [(i % c, j % c)]
                    elif j // c == i // c - 1:
                        pairs = [(min(i % c + c, chunk), j % c)]
                    else:
                        pairs = [(min(2 * c - 1, chunk), j % c)]
                    scale = params.get("scale", "chunkllama")
                    # ChunkLlama: q and k's rotary dims x 0.05 ln(n/L) + 1 past L; vLLM's DualChunkFlashAttention:
                    # the key and the softmax scale x max(1, 0.1 ln(n / original) + 1), so every logit x its square
                    m = 0.05 * math.log(n / trained) + 1 if scale == "chunkllama" and n > trained else 1.0
                    if scale == "vllm":
                        logit = max(1.0, 0.1 * math.log(n / params["original"]) + 1) ** 2
                else:
                    shift, local, d = params["shift"], params["local"], i - j
                    pairs = ([(i, j)] if (d <= shift if prefill else d < shift) else []) + (
                        [(i - shift + local, j)] if d >= shift else []
                    )
                    m = 0.1 * math.log(2) + 1
                q[:rd], k[:rd] = q[:rd] * m, k[:rd] * m
                terms += [((rope_at(q, pi) * rope_at(k, pj)).sum() * logit / math.sqrt(dim), j) for pi, pj in pairs]
            weights = torch.softmax(torch.stack([t for t, _ in terms]), 0)
            out[a, h] = sum(w * v[h, j].double() for w, (_, j) in zip(weights, terms))
    return out


CASES = [
    ("dca", {"chunk_size": 17, "local_size": 4}, 20),  # c = 13; 47 keys: four chunks, temperature past 20
    ("dca", {"chunk_size": 19, "local_size": 11}, 80),  # c = 8: 2c - 1 = 15 < chunk_size; no temperature
    ("dca", {"chunk_size": 17, "local_size": 4, "scale": "vllm", "original": 30}, 20),  # vLLM's, past original
    ("dca", {"chunk_size": 17, "local_size": 4, "scale": "vllm", "original": 60}, 20),  # below it: clamped to 1
    ("string", {"shift": 13, "local": 3}, 40),
    ("string", {"shift": 20, "local": 20}, 40),  # W = S: the shifted part at true distance (max shift allowed)
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[2]}-{c[1].get('original', 0)}")
@pytest.mark.parametrize("rotary_dim", [16, 8], ids=["full-rotary", "partial-rotary"])
@pytest.mark.parametrize("queries", [47, 1, 9], ids=["prefill", "decode", "continuation"])
def test_both_paths_equal_the_brute_force(case, rotary_dim, queries):
    name, params, trained = case
    spec = resolve_attention(name, params)
    gen = torch.Generator().manual_seed(queries)
    heads, kv_heads, dim, keys = 4, 2, 16, 47
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2).double() / rotary_dim))
    q_raw = torch.randn(heads, queries, dim, generator=gen, dtype=torch.float64)
    k_raw = torch.randn(kv_heads, keys, dim, generator=gen, dtype=torch.float64)
    value = torch.randn(kv_heads, keys, dim, generator=gen, dtype=torch.float64)
    k_pos = torch.arange(keys)
    q_pos = k_pos[-queries:]
    query = rotate(q_raw[None], q_pos[None], inv_freq).float()
    key = rotate(k_raw[None], k_pos[None], inv_freq).float()
    want = brute_force(
        q_raw,
        k_raw.repeat_interleave(2, 0),
        value.repeat_interleave(2, 0),
        inv_freq,
        name,
        params,
        trained,
        queries == keys,
    )
    args = (query, key, value[None].float(), q_pos[None], k_pos[None], None, dim**-0.5, inv_freq.float(), (spec,))
    assert (fused_shifted(*args, trained)[0].double() - want).abs().max() < 1e-5
    assert (attend_shifted(*args, trained, chunk=5)[0].double() - want).abs().max() < 1e-5


def logits_under(model, text, ids, trained=64, temperature=1.0):
    spec = expand_specs([text])[0] if text else None
    rotary = find_rotary_modules(model)[0][1]
    with (
        attention_methods(model, spec.attention if spec else (), lambda: rotary.inv_freq, trained),
        attention_temperature(model, temperature),
        torch.inference_mode(),
    ):
        return model(input_ids=ids).logits


def test_dca_is_plain_rope_while_the_sequence_fits_one_chunk():
    model = tiny_llama()
    ids = torch.randint(0, 128, (1, 40), generator=torch.Generator().manual_seed(0))
    plain = logits_under(model, None, ids)
    assert torch.equal(logits_under(model, "dca:chunk_size=50,local_size=10", ids), plain)  # 40 <= c = 40
    assert not torch.equal(logits_under(model, "dca:chunk_size=49,local_size=10", ids), plain)  # c = 39


def test_string_below_its_shift_is_rope_with_its_constant_factor():
    """Full rotary: cos and sin x f on q and k is the softmax temperature f^2 (ctxeval's other path for it)."""
    model = tiny_llama()
    ids = torch.randint(0, 128, (1, 30), generator=torch.Generator().manual_seed(1))
    factor = 0.1 * math.log(2) + 1
    string = logits_under(model, "string:shift=30,local=8", ids)
    assert (string - logits_under(model, None, ids, temperature=factor**2)).abs().max() < 1e-5
    assert (string - logits_under(model, None, ids)).abs().max() > 1e-3
    past = logits_under(model, "string:shift=29,local=8", ids)  # the last query sees key 0 at distance 29 = S
    assert (past - string).abs().max() > 1e-4


@pytest.mark.parametrize("text", ["dca:chunk_size=30,local_size=6", "string:shift=20,local=4"])
def test_the_probe_crosses_every_rule_and_equals_the_formula(text):
    for model in (tiny_llama(), tiny_neox()):
        spec = expand_specs([text])[0]
        inv_freq = find_rotary_modules(model)[0][1].inv_freq
        with attention_methods(model, spec.attention, lambda f=inv_freq: f, 64):
            check = verify_attention_methods(model, spec.attention, lambda f=inv_freq: f, 64)
        assert check["max_abs_diff_vs_reference"] < 1e-5
        rules = ["intra", "successive", "inter"] if text.startswith("dca") else ["near", "shifted"]
        assert check["rules_probed"] == rules


def test_sizes_defaults_and_what_run_json_records():
    dca, string = resolve_attention("dca", {}), resolve_attention("string", {})
    assert in_effect(dca, 8192)["chunk_size"] == 6144 and in_effect(dca, 8192)["local_size"] == 1024
    assert in_effect(string, 131072)["shift"] == 43253  # STRING's README: 131072 x 0.33
    assert in_effect(string, 131072)["rotary_logit_factor"] == pytest.approx((0.1 * math.log(2) + 1) ** 2)
    qwen = resolve_attention("dca", {"chunk_size": 262144, "local_size": 8192, "scale": "vllm", "original": 262144})
    assert noop_reason((qwen,), [253952], 32768) is not None  # Qwen's settings: nothing changes up to 253,952
    assert noop_reason((qwen,), [253953], 32768) is None
    assert noop_reason((string,), [16], 8192) is None  # its factor applies at every length
    assert change_points(dca, 64) == [40, 48, 80]


def test_relative_positions_drawn_for_a_key_at_zero():
    dca = resolve_attention("dca", {"chunk_size": 48, "local_size": 8})  # c = 40
    assert list(relative_position(dca, [39, 40, 47, 48, 60, 80, 200], 64)) == [39, 40, 47, 48, 48, 48, 48]
    string = resolve_attention("string", {"shift": 21, "local": 5})
    assert list(relative_position(string, [20, 21, 30], 64)) == [20, 5, 14]


@pytest.mark.parametrize(
    "params, message",
    [
        ({"chunk_size": 8, "local_size": 8}, "dca: chunk_size (8) must be larger than local_size (8)"),
        ({"shift": 65, "local": 8}, "string: shift 65 must be between 1 and the trained length 64"),
        ({"shift": 10, "local": 11}, "string: local (11) must be <= shift (10)"),
    ],
)
def test_bad_sizes_are_one_line_errors(params, message):
    name = "dca" if "chunk_size" in params else "string"
    with pytest.raises(CtxevalError, match=r"^" + message.replace("(", r"\(").replace(")", r"\)")):
        check_sizes((resolve_attention(name, params),), 64)


def test_bad_sizes_are_refused_by_the_cli_before_the_weights_load(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import ctxeval.cli.run as run
    from ctxeval.cli import app

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(run, "load_for", no_load)
    for method, message in [
        ("string:shift=200", "error: string: shift 200 must be between 1 and the trained length 128"),
        ("dca:chunk_size=20,local_size=20", "error: dca: chunk_size (20) must be larger than local_size (20)"),
        ("dca:local_size=96", "error: dca: chunk_size (96) must be larger than local_size (96)"),  # 3L/4 = 96
    ]:
        result = CliRunner().invoke(app, ["ppl", "--model", "tiny", "-m", method, "--out", str(tmp_path / "r")])
        assert result.exit_code == 2 and result.stderr.strip().splitlines() == [
            message + result.stderr.split(message)[1].strip()
        ]
        assert not (tmp_path / "r").exists()


def test_dca_with_its_temperature_is_measured_length_by_length():
    dca, none_scale, string = expand_specs(["dca", "dca:scale=none", "string"])
    assert dca.length_dependent and not none_scale.length_dependent and not string.length_dependent


def test_a_model_whose_attention_cannot_be_patched_is_refused_in_one_line():
    model = tiny_llama()
    model.config._attn_implementation = "flash_attention_2"
    spec = expand_specs(["dca:chunk_size=30,local_size=6"])[0]
    with pytest.raises(CtxevalError, match=r"^dca replaces the attention computation.*rerun with --attn sdpa$"):
        with attention_methods(model, spec.attention, lambda: None, 64):
            pass


def test_native_applies_the_dca_a_checkpoint_ships_and_presets_name_qwens(tmp_path, tiny_model_dir, text_dir):
    import json
    import shutil

    from typer.testing import CliRunner

    from ctxeval.cli import app
    from ctxeval.specs import expand_specs

    model = tmp_path / "dca-model"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "config.json").read_text())
    shipped = {"chunk_size": 40, "local_size": 8, "original_max_position_embeddings": 32}
    (model / "config.json").write_text(json.dumps({**config, "dual_chunk_attention_config": shipped}))
    args = ["ppl", "--model", str(model), "--data", str(text_dir), "--lengths", "100", "--device", "cpu"]
    methods = ["-m", "native", "-m", "dca:chunk_size=40,local_size=8,scale=vllm,original=32", "-m", "none"]
    result = CliRunner().invoke(app, [*args, *methods, "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert "native is measured as native+dca(chunk_size=40,local_size=8,original=32,scale=vllm)" in result.stderr
    rows = [json.loads(line) for line in (tmp_path / "run" / "rows.jsonl").read_text().splitlines()]
    value = {r["label"].split("+")[0].split("(")[0]: r["value"] for r in rows}
    assert value["native"] == pytest.approx(value["dca"], rel=1e-6) and value["native"] != value["none"]
    qwen = expand_specs(["qwen2.5-1m-dca", "qwen3-2507-dca"])
    assert all(
        s.attention[0].params == {**s.attention[0].params, "chunk_size": 262144, "local_size": 8192} for s in qwen
    )
    assert noop_reason(qwen[0].attention, [253952], 262144) and not noop_reason(qwen[0].attention, [253953], 262144)


def test_through_the_cli_run_json_records_the_sizes_and_a_no_op_is_said(tmp_path):
    import json

    from typer.testing import CliRunner

    from ctxeval.cli import app

    args = ["ppl", "--model", "tiny", "--docs", "1", "--device", "cpu", "-m", "none", "-m", "dca", "-m"]
    result = CliRunner().invoke(app, [*args, "string:local=16", "--lengths", "64,160", "--out", str(tmp_path / "a")])
    assert result.exit_code == 0, result.output
    methods = json.loads((tmp_path / "a" / "run.json").read_text())["methods"]
    dca, string = methods["dca"], methods["string(local=16)"]
    assert dca["attention_methods"][0]["in_effect"]["chunk_len"] == 80  # 3L/4 - L/8 at L = 128
    assert dca["attention_check"]["rules_probed"] == ["intra", "successive", "inter"]
    assert string["attention_methods"][0]["in_effect"]["shift"] == 42  # int(0.33 x 128)
    rows = [json.loads(line) for line in (tmp_path / "a" / "rows.jsonl").read_text().splitlines()]
    value = {(r["label"], r["length"]): r["value"] for r in rows}
    assert value[("dca", 64)] == pytest.approx(value[("none", 64)], rel=1e-6)  # one chunk: plain RoPE
    assert value[("dca", 160)] != pytest.approx(value[("none", 160)], rel=1e-3)
    quiet = CliRunner().invoke(app, [*args[:-1], "--lengths", "64", "--out", str(tmp_path / "b")])
    assert quiet.exit_code == 0 and "dca's chunk 96 - local 16 = 80 >= the longest length 64" in quiet.stderr
