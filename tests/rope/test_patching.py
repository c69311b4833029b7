"""apply_method on a tiny random Llama: logits equal a model built with the same rope_parameters; restore is exact."""

import numpy as np
import pytest
import torch
from helpers import TINY, tiny_llama
from transformers import GPT2Config, GPT2LMHeadModel, GPTNeoXConfig, GPTNeoXForCausalLM

from ctxeval import apply_method
from ctxeval.errors import CtxevalError
from ctxeval.rope.geometry import rope_info_from_config
from ctxeval.rope.methods import Geometry, compute
from ctxeval.rope.patching import find_rotary_modules

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
    with apply_method(model, "dynamic-yarn"):
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
    cfg = GPTNeoXConfig(
        vocab_size=128,
        hidden_size=64,
        num_attention_heads=4,
        num_hidden_layers=2,
        intermediate_size=128,
        max_position_embeddings=64,
        rotary_pct=0.25,
    )
    model = GPTNeoXForCausalLM(cfg).eval()
    info = rope_info_from_config(model.config)
    assert info.geometry == Geometry(4, 10000.0, 64)  # head_dim 16 * 0.25
    ids = torch.randint(0, 128, (1, 128))
    before = logits(model, ids)
    torch.manual_seed(0)
    fresh = GPTNeoXForCausalLM(
        GPTNeoXConfig(
            **{
                **cfg.to_dict(),
                "rope_parameters": {
                    "rope_type": "linear",
                    "factor": 2.0,
                    "rope_theta": 10000.0,
                    "partial_rotary_factor": 0.25,
                },
            }
        )
    ).eval()
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
    from transformers import Gemma3TextConfig, LlamaConfig

    legacy = LlamaConfig(
        rope_scaling={"type": "linear", "factor": 2.0},
        rope_theta=5e5,
        max_position_embeddings=4096,
        hidden_size=256,
        num_attention_heads=4,
    )
    info = rope_info_from_config(legacy)
    assert info.geometry == Geometry(64, 5e5, 4096) and info.shipped["rope_type"] == "linear"
    shipped = LlamaConfig(
        hidden_size=256,
        num_attention_heads=4,
        max_position_embeddings=131072,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 5e5,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    )
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
    cfg = Gemma3TextConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=64,
        sliding_window=16,
    )
    model = Gemma3ForCausalLM(cfg).eval()
    ids = torch.randint(0, 128, (1, 40))
    before = logits(model, ids)
    with apply_method(model, "none") as handle:
        assert "Gemma 3" in handle.record()["note"]
        assert torch.equal(logits(model, ids), before)
    with pytest.raises(CtxevalError, match="per attention layer type"):
        apply_method(model, "yarn", factor=2)


def test_native_keeps_the_shipped_rope_and_records_it():
    model = tiny_llama(
        {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16},
        max_position_embeddings=64,
    )
    ids = torch.randint(0, TINY["vocab_size"], (1, 80))
    before = logits(model, ids)
    with apply_method(model, "native") as handle:
        assert torch.equal(logits(model, ids), before)
        rec = handle.record()
    assert rec["shipped_rope_parameters"]["rope_type"] == "yarn"
    want = compute("yarn", Geometry(16, 10000.0, 16), {"factor": 4.0})
    assert rec["effective"][0]["attention_factor_readback"] == pytest.approx(want.attention_factor, rel=1e-6)
    np.testing.assert_allclose(rec["effective"][0]["inv_freq_readback"], want.inv_freq, rtol=1e-5)


# -- the survivors of mutmut 3.8.1 over rope/patching.py (docs/testing.md): other rotary layouts and module shapes, the
# -- read-back arithmetic, the run record, and every refusal


class FakeRotary(torch.nn.Module):
    """A transformers-style rotary module (inv_freq + attention_scaling) with a chosen cos/sin layout."""

    def __init__(self, d=8, layout="half", name_has_rotary=True):
        super().__init__()
        self.register_buffer(
            "inv_freq", torch.tensor(Geometry(d, 1e4, 64).default_inv_freq(), dtype=torch.float32), persistent=False
        )
        self.attention_scaling = 1.0
        self.layout = layout

    def forward(self, x, position_ids):
        freqs = position_ids[..., None].float() * self.inv_freq  # (B, T, d/2)
        if self.layout == "half":
            emb = torch.cat((freqs, freqs), dim=-1)
        elif self.layout == "interleaved":
            emb = torch.repeat_interleave(freqs, 2, dim=-1)
        else:  # neither: the pairs' angles in an order nobody decodes
            emb = torch.cat((freqs, freqs.flip(-1)), dim=-1)
        return emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling


class PositionTable(FakeRotary):
    """The same module under a class name without 'Rotary' (older models' per-layer embeddings)."""


def holder(*modules):
    model = torch.nn.Module()
    for i, m in enumerate(modules):
        model.add_module(f"m{i}", m)
    return model


GEOM8 = Geometry(8, 1e4, 64)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_both_cos_sin_layouts_are_read_back(layout):
    rotary = FakeRotary(layout=layout)
    with apply_method(holder(rotary), "yarn", geometry=GEOM8, factor=4) as handle:
        (rb,) = handle.readback()
        want = compute("yarn", GEOM8, {"factor": 4})
        np.testing.assert_allclose(rb.inv_freq, want.inv_freq, rtol=1e-6)
        assert rb.attention_factor == pytest.approx(want.attention_factor, rel=1e-6)


def test_an_undecodable_layout_is_refused_and_the_module_restored():
    rotary = FakeRotary(layout="scrambled")
    before = rotary.inv_freq.clone()
    with pytest.raises(CtxevalError) as caught:
        apply_method(holder(rotary), "pi", geometry=GEOM8, factor=2)
    assert str(caught.value) == "cannot decode the cos/sin layout of FakeRotary"
    assert torch.equal(rotary.inv_freq, before) and rotary.attention_scaling == 1.0 and rotary.rope_type is None


def test_which_modules_count_as_rotary():
    plain = PositionTable()  # inv_freq and attention_scaling, no 'Rotary' in the name: found, patchable
    container = torch.nn.Module()
    container.__class__ = type("RotaryContainer", (torch.nn.Module,), {})
    container.add_module("inner", FakeRotary())  # a Rotary-named parent of a rotary module is not one itself
    odd = type("MyRotaryEmbedding", (torch.nn.Module,), {})()
    odd.register_buffer("_inv_freq", torch.ones(4))  # a rotary module ctxeval cannot patch: found, then refused
    unrelated = torch.nn.Module()
    unrelated.register_buffer("cached_inv_freq", torch.ones(4))  # neither a Rotary name nor an inv_freq attribute
    model = holder(plain, container, odd, unrelated)
    assert [name for name, _ in find_rotary_modules(model)] == ["m0", "m1.inner", "m2"]
    with pytest.raises(CtxevalError) as caught:
        apply_method(model, "pi", geometry=GEOM8, factor=2)
    assert str(caught.value) == (
        "MyRotaryEmbedding ('m2') is not a transformers-style rotary module (inv_freq + "
        "attention_scaling); ctxeval cannot patch it: use --method none"
    )
    no_scaling = FakeRotary()
    del no_scaling.attention_scaling
    with pytest.raises(CtxevalError, match=r"^FakeRotary \('m0'\) is not a transformers-style"):
        apply_method(holder(no_scaling), "pi", geometry=GEOM8, factor=2)
    with apply_method(holder(PositionTable()), "pi", geometry=GEOM8, factor=2) as handle:
        assert [n for n, _ in handle.modules] == ["m0"] and handle.verify() < 1e-6


def test_max_rel_diff_is_relative_to_the_expected_values():
    from ctxeval.rope.methods import RopeFreqs
    from ctxeval.rope.patching import Readback

    expected = RopeFreqs(np.array([0.5, 0.01]), 2.0)
    assert Readback(np.array([0.5, 0.0101]), 2.0).max_rel_diff(expected) == pytest.approx(0.01)
    assert Readback(np.array([0.5, 0.01]), 2.2).max_rel_diff(expected) == pytest.approx(0.1)


def test_a_dynamic_method_needs_position_ids():
    rotary = FakeRotary()
    with apply_method(holder(rotary), "dynamic-ntk", geometry=GEOM8, factor=2):
        with pytest.raises(CtxevalError) as caught:
            rotary(torch.zeros(1, 3, 8))
    assert str(caught.value) == "FakeRotary was called without position_ids; cannot apply a dynamic method"


def test_a_dynamic_method_copies_frequencies_once_per_length(monkeypatch, llama):
    copies = []
    real = torch.from_numpy
    monkeypatch.setattr(torch, "from_numpy", lambda a: (copies.append(len(a)), real(a))[1])
    ids = torch.randint(0, TINY["vocab_size"], (1, 2 * L))
    with apply_method(llama, "dynamic-ntk", factor=2):
        logits(llama, ids)
        first = len(copies)
        for _ in range(3):
            logits(llama, ids)  # the same length again: the frequencies already on the device are reused
        assert len(copies) == first


def test_a_geometry_that_disagrees_with_the_module_is_refused():
    with pytest.raises(CtxevalError) as caught:
        apply_method(holder(FakeRotary(d=8)), "pi", geometry=Geometry(16, 1e4, 64), factor=2)
    assert str(caught.value) == (
        "rotary module has 4 frequencies but the geometry gives 8 (rotary dim 16); the "
        "config's head_dim/partial_rotary_factor disagree with the model"
    )


def test_restore_puts_back_a_module_without_rope_type_and_its_cached_length():
    rotary = FakeRotary()
    rotary.max_seq_len_cached = 64
    assert not hasattr(rotary, "rope_type")
    handle = apply_method(holder(rotary), "dynamic-ntk", geometry=GEOM8, factor=2)
    rotary.max_seq_len_cached = 999  # what transformers' own dynamic update would have done
    handle.restore()
    assert rotary.max_seq_len_cached == 64 and rotary.rope_type is None


def test_handles_keep_their_model_method_and_parameters(llama):
    with apply_method(llama, "yarn", factor=2) as handle:
        assert handle.model is llama and handle.method.name == "yarn" and handle.params["factor"] == 2.0
    gpt2 = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=64)).eval()
    with apply_method(gpt2, "none") as none:
        assert none.model is gpt2 and none.method.name == "none" and none.params == {}
        assert none.record() == {
            "method": "none",
            "params": {},
            "length_dependent": False,
            "geometry": None,
            "rotary_modules": [],
            "effective": [],
            "note": "model has no RoPE",
        }
        assert none.verify() == 0.0
    shipped = tiny_llama({"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0})
    with apply_method(shipped, "native") as native:
        assert native.model is shipped and native.method.name == "native" and native.params == {}
        assert native.verify() == 0.0  # nothing was written, so nothing to compare


def test_why_a_method_cannot_run_on_a_model():
    no_module = tiny_llama()
    del no_module.model.rotary_emb  # a RoPE config, but no rotary module to patch
    with pytest.raises(CtxevalError) as caught:
        apply_method(no_module, "pi", factor=2)
    assert str(caught.value) == (
        "method 'pi' needs a RoPE model, but no rotary embedding module was found in it; use "
        "--method none for this model"
    )
    with apply_method(no_module, "none") as handle:
        assert handle.record()["note"] == "model has no RoPE"
    gpt2 = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=64)).eval()
    gpt2.add_module("rotary", FakeRotary())  # a rotary module, but no RoPE in the config
    with pytest.raises(CtxevalError) as caught:
        apply_method(gpt2, "pi", factor=2)
    assert str(caught.value) == (
        "method 'pi' needs a RoPE model, but its config has no RoPE parameters; use --method none for this model"
    )


@pytest.mark.parametrize("marker", ["layer_types", "rope_type"])
def test_any_per_layer_type_marker_is_refused(marker):
    rotary = FakeRotary()
    if marker == "layer_types":
        rotary.layer_types = ("full_attention", "sliding_attention")
    else:
        rotary.rope_type = {"full_attention": "default", "sliding_attention": "default"}
    model = holder(rotary)
    with pytest.raises(CtxevalError) as caught:
        apply_method(model, "pi", geometry=GEOM8, factor=2)
    assert str(caught.value) == (
        "this model uses a different RoPE per attention layer type ('m0', Gemma 3 style); "
        "ctxeval cannot apply extension methods to it yet: use --method none"
    )
    with apply_method(model, "none", geometry=GEOM8) as handle:
        assert handle.model is model and handle.record()["note"] == (
            "per-layer-type RoPE (Gemma 3 style) left as the checkpoint ships it"
        )
        assert handle.method.name == "none" and handle.params == {}


def test_the_run_record_of_a_static_and_a_dynamic_method(llama):
    geom = rope_info_from_config(llama.config).geometry
    with apply_method(llama, "yarn", factor=4) as handle:
        rec = handle.record((L, 4 * L))  # a static method: one entry whatever the lengths
        want = compute("yarn", geom, {"factor": 4})
        (entry,) = rec["effective"]
        assert set(rec) == {"method", "params", "length_dependent", "geometry", "rotary_modules", "effective"}
        assert (rec["method"], rec["params"]["factor"], rec["length_dependent"]) == ("yarn", 4.0, False)
        assert rec["geometry"] == {"rotary_dim": geom.rotary_dim, "base": geom.base, "original_length": L}
        assert rec["rotary_modules"] == ["model.rotary_emb"] and entry["length"] is None
        assert entry["inv_freq"] == want.inv_freq.tolist() and entry["attention_factor"] == want.attention_factor
        np.testing.assert_allclose(entry["inv_freq_readback"], want.inv_freq, rtol=1e-6)
        assert entry["attention_factor_readback"] == pytest.approx(want.attention_factor, rel=1e-6)
        assert 0 <= entry["max_rel_diff"] < 1e-6
    with apply_method(llama, "dynamic-ntk", factor=2) as handle:
        rec = handle.record((4 * L, L, 4 * L))
        assert rec["length_dependent"] is True and [e["length"] for e in rec["effective"]] == [L, 4 * L]
        for e in rec["effective"]:
            assert e["inv_freq"] == compute("dynamic-ntk", geom, {"factor": 2}, e["length"]).inv_freq.tolist()
        assert handle.readback(1)[0].inv_freq == pytest.approx(geom.default_inv_freq(), rel=1e-6)  # written back at L
        assert [e["length"] for e in handle.record()["effective"]] == [None]  # no lengths: the RoPE at L


def test_the_run_record_of_native(llama):
    shipped = tiny_llama({"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0})
    with apply_method(shipped, "native") as handle:
        rec = handle.record()
    geom = rope_info_from_config(shipped.config).geometry
    assert set(rec) == {
        "method",
        "params",
        "length_dependent",
        "rotary_modules",
        "shipped_rope_parameters",
        "effective",
        "note",
    }
    assert (rec["method"], rec["params"], rec["length_dependent"], rec["rotary_modules"]) == (
        "native",
        {},
        None,
        ["model.rotary_emb"],
    )
    assert rec["shipped_rope_parameters"]["factor"] == 2.0 and rec["note"] == "the checkpoint's own RoPE, untouched"
    (entry,) = rec["effective"]
    assert (
        set(entry) == {"length", "attention_factor_readback", "inv_freq_readback"}
        and entry["length"] == geom.original_length
    )
    np.testing.assert_allclose(entry["inv_freq_readback"], geom.default_inv_freq() / 2, rtol=1e-6)
    assert entry["attention_factor_readback"] == pytest.approx(1.0)


def test_verify_checks_a_dynamic_method_past_the_trained_length(llama):
    handle = apply_method(llama, "dynamic-ntk", factor=2)
    handle._hooks.pop().remove()  # the per-forward update lost: right at L, wrong past it
    with pytest.raises(CtxevalError, match=r"differs from dynamic-ntk by .* at length 128"):
        handle.verify()


def test_after_verify_and_record_a_dynamic_method_holds_the_rope_of_L(llama):
    geom = rope_info_from_config(llama.config).geometry
    at_l = torch.tensor(compute("dynamic-ntk", geom, {"factor": 2}, L).inv_freq, dtype=torch.float32)
    with apply_method(llama, "dynamic-ntk", factor=2) as handle:
        buffer = llama.model.rotary_emb.inv_freq
        assert torch.equal(buffer, at_l)  # verify read back 2L and 8L, then wrote L's frequencies back
        handle.record((4 * L,))
        assert torch.equal(buffer, at_l)
        handle.freeze_length(4 * L)
        handle.verify((4 * L,))  # while frozen for generation, the frozen length's RoPE stays
        assert not torch.equal(buffer, at_l)
        handle.freeze_length(None)


def test_native_on_models_without_a_readable_rope():
    gpt2 = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=64)).eval()
    with apply_method(gpt2, "native") as handle:
        rec = handle.record()
    assert rec["rotary_modules"] == [] and rec["effective"] == [] and not rec["shipped_rope_parameters"]
    no_module = tiny_llama()
    del no_module.model.rotary_emb
    with apply_method(no_module, "native") as handle:
        assert handle.record()["effective"] == []
    odd = tiny_llama()
    del odd.model.rotary_emb.attention_scaling  # found as a rotary module, but not one ctxeval can read back
    with apply_method(odd, "native") as handle:
        assert handle.record()["rotary_modules"] == [] and handle.record()["effective"] == []
