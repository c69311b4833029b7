"""apply_method on a tiny random Llama: logits equal a model built with the same rope_parameters; restore is exact."""

import numpy as np
import pytest
import torch
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, GPT2Config, GPT2LMHeadModel

from ctxeval import apply_method
from ctxeval.errors import CtxevalError
from ctxeval.methods import Geometry, compute
from ctxeval.geometry import rope_info_from_config
from ctxeval.patching import find_rotary_modules

from conftest import TINY, tiny_llama

L = TINY["max_position_embeddings"]


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize(
    "rope_type,method,params",
    [
        ("linear", "pi", {"factor": 4.0}),
        ("dynamic", "dynamic-ntk", {"factor": 2.0}),
        ("yarn", "yarn", {"factor": 4.0}),
        ("yarn", "yarn", {"factor": 8.0, "truncate": False, "beta_fast": 16.0, "beta_slow": 2.0}),
        ("llama3", "llama3", {"factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}),
    ],
)
def test_patched_equals_freshly_built(rope_type, method, params):
    ids = torch.randint(0, TINY["vocab_size"], (1, 3 * L))
    model = tiny_llama()
    rp = {"rope_type": rope_type, "rope_theta": 10000.0, **params}
    if rope_type in ("yarn", "llama3"):
        rp["original_max_position_embeddings"] = L
    fresh = tiny_llama(rp, max_position_embeddings=L)
    fresh.load_state_dict(model.state_dict())
    want = logits(fresh, ids)
    with apply_method(model, method, **params) as handle:
        got = logits(model, ids)
        assert handle.verify() < 1e-5
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_restore_is_exact_and_context_manager(llama):
    ids = torch.randint(0, TINY["vocab_size"], (1, 2 * L))
    before = logits(llama, ids)
    with apply_method(llama, "yarn", factor=4) as handle:
        assert handle.attention_factor == pytest.approx(0.1 * np.log(4) + 1)
        assert not torch.equal(logits(llama, ids), before)
    assert torch.equal(logits(llama, ids), before)
    handle = apply_method(llama, "dynamic-yarn")
    handle.restore()
    assert torch.equal(logits(llama, ids), before)


def test_dynamic_is_order_independent():
    """transformers' own dynamic module keeps the largest length seen; ours recomputes per forward."""
    model = tiny_llama()
    short = torch.randint(0, TINY["vocab_size"], (1, 2 * L))
    long = torch.randint(0, TINY["vocab_size"], (1, 4 * L))
    with apply_method(model, "dynamic-ntk", factor=2):
        a_first = logits(model, short)
        logits(model, long)
        a_after_long = logits(model, short)
    torch.testing.assert_close(a_first, a_after_long, rtol=0, atol=0)
    with apply_method(model, "dynamic-yarn") as handle:
        logits(model, long)
        b = logits(model, short)
    fresh_order = tiny_llama()
    with apply_method(fresh_order, "dynamic-yarn"):
        b_fresh = logits(fresh_order, short)
    torch.testing.assert_close(b, b_fresh, rtol=0, atol=0)


def test_dynamic_readback_per_length(llama):
    with apply_method(llama, "dynamic-ntk", factor=2) as handle:
        geom = handle.geometry
        for n in (L, 2 * L, 5 * L):
            rb = handle.readback(n)[0]
            want = compute("dynamic-ntk", geom, {"factor": 2}, n)
            np.testing.assert_allclose(rb.inv_freq, want.inv_freq, rtol=1e-5)
        rec = handle.record((L, 4 * L))
        assert [e["length"] for e in rec["effective"]] == [L, 4 * L]
        assert all(e["max_rel_diff"] < 1e-5 for e in rec["effective"])


def test_frozen_length_for_generation(llama):
    with apply_method(llama, "dynamic-yarn") as handle:
        handle.freeze_length(4 * L)
        rb = handle.readback(L)[0]  # a short forward still uses the frozen length's RoPE
        np.testing.assert_allclose(rb.inv_freq, compute("dynamic-yarn", handle.geometry, {}, 4 * L).inv_freq, rtol=1e-5)
        handle.freeze_length(None)


def test_mismatch_is_an_error(llama):
    """A model whose rotary module ignores what we write must be caught by the read-back."""
    rotary = llama.model.rotary_emb
    original_forward = type(rotary).forward

    def stale_forward(self, x, position_ids):  # uses a private copy of the old frequencies
        freqs = position_ids[..., None].float() * self.stale_inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling

    rotary.stale_inv_freq = rotary.inv_freq.clone()
    rotary.forward = stale_forward.__get__(rotary)
    with pytest.raises(CtxevalError, match="read back"):
        apply_method(llama, "pi", factor=4)
    assert rotary.attention_scaling == 1.0  # restored after the failed verification
    del rotary.forward
    assert type(rotary).forward is original_forward


def test_partial_rotary_gpt_neox():
    torch.manual_seed(0)
    cfg = GPTNeoXConfig(vocab_size=128, hidden_size=64, num_attention_heads=4, num_hidden_layers=2, intermediate_size=128,
                        max_position_embeddings=64, rotary_pct=0.25)
    model = GPTNeoXForCausalLM(cfg).eval()
    info = rope_info_from_config(model.config)
    assert info.geometry == Geometry(4, 10000.0, 64)  # head_dim 16 * 0.25
    ids = torch.randint(0, 128, (1, 128))
    before = logits(model, ids)
    torch.manual_seed(0)
    fresh = GPTNeoXForCausalLM(GPTNeoXConfig(**{**cfg.to_dict(), "rope_parameters": {
        "rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0, "partial_rotary_factor": 0.25}})).eval()
    fresh.load_state_dict(model.state_dict())
    with apply_method(model, "pi", factor=2) as handle:
        assert handle.verify() < 1e-5
        torch.testing.assert_close(logits(model, ids), logits(fresh, ids), rtol=1e-5, atol=1e-5)
    assert torch.equal(logits(model, ids), before)


def test_model_without_rope():
    model = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=64)).eval()
    assert rope_info_from_config(model.config).geometry is None
    assert find_rotary_modules(model) == []
    with apply_method(model, "none"):
        pass
    with pytest.raises(CtxevalError, match="needs a RoPE model"):
        apply_method(model, "yarn", factor=2)


def test_config_shapes():
    from transformers import LlamaConfig, Gemma3TextConfig

    legacy = LlamaConfig(rope_scaling={"type": "linear", "factor": 2.0}, rope_theta=5e5, max_position_embeddings=4096,
                         hidden_size=256, num_attention_heads=4)
    info = rope_info_from_config(legacy)
    assert info.geometry == Geometry(64, 5e5, 4096) and info.shipped["rope_type"] == "linear"
    shipped = LlamaConfig(hidden_size=256, num_attention_heads=4, max_position_embeddings=131072, rope_parameters={
        "rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192})
    assert rope_info_from_config(shipped).geometry.original_length == 8192  # the ORIGINAL length is the reference
    gemma = rope_info_from_config(Gemma3TextConfig())
    assert gemma.per_layer_types == ("full_attention", "sliding_attention")
    assert gemma.geometry.base == 1e6  # the global layers' base


def test_model_shipping_dynamic_scaling_is_overridden_and_restored():
    model = tiny_llama({"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0})
    ids = torch.randint(0, TINY["vocab_size"], (1, 2 * L))
    before = logits(model, ids)
    with apply_method(model, "none"):
        plain = logits(model, ids)
    reference = tiny_llama()
    reference.load_state_dict(model.state_dict())
    torch.testing.assert_close(plain, logits(reference, ids), rtol=1e-5, atol=1e-5)
    assert model.model.rotary_emb.rope_type == "dynamic"
    torch.testing.assert_close(logits(model, ids), before, rtol=1e-6, atol=1e-6)


def test_gemma3_per_layer_rope_is_refused_except_none():
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    cfg = Gemma3TextConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=16, max_position_embeddings=64, sliding_window=16)
    model = Gemma3ForCausalLM(cfg).eval()
    ids = torch.randint(0, 128, (1, 40))
    before = logits(model, ids)
    with apply_method(model, "none") as handle:
        assert "Gemma 3" in handle.record()["note"]
        assert torch.equal(logits(model, ids), before)
    with pytest.raises(CtxevalError, match="per attention layer type"):
        apply_method(model, "yarn", factor=2)


def test_native_keeps_the_shipped_rope_and_records_it():
    model = tiny_llama({"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16},
                       max_position_embeddings=64)
    ids = torch.randint(0, TINY["vocab_size"], (1, 80))
    before = logits(model, ids)
    with apply_method(model, "native") as handle:
        assert torch.equal(logits(model, ids), before)
        rec = handle.record()
    assert rec["shipped_rope_parameters"]["rope_type"] == "yarn"
    want = compute("yarn", Geometry(16, 10000.0, 16), {"factor": 4.0})
    assert rec["effective"][0]["attention_factor_readback"] == pytest.approx(want.attention_factor, rel=1e-6)
    np.testing.assert_allclose(rec["effective"][0]["inv_freq_readback"], want.inv_freq, rtol=1e-5)
