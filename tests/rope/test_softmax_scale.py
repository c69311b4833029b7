"""DeepSeek-YaRN's softmax scale (rope/softmax_scale.py) on tiny random DeepseekV3 models (CPU, seconds): the scaling
ctxeval sets and reads back equals what DeepseekV3Attention computes natively from the same rope config (probed at the
attention call), a full-rotary head's logits equal YaRN with m(s, mscale), and a model whose attention has no place for
the term is refused in one line."""

from __future__ import annotations

import math

import pytest
import torch

from ctxeval.attention.patching import watch_sdpa
from ctxeval.errors import CtxevalError
from ctxeval.rope.patching import apply_method

SHIPPED = {  # DeepSeek-V3's rope_parameters at a tiny length: factor 40, mscale = mscale_all_dim = 1
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 40.0,
    "original_max_position_embeddings": 64,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
}


def deepseek(rope_parameters: dict, nope: int = 8, seed: int = 0):
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    cfg = DeepseekV3Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        q_lora_rank=None,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=nope,
        v_head_dim=8,
        n_routed_experts=4,
        num_experts_per_tok=2,
        first_k_dense_replace=1,
        n_group=1,
        topk_group=1,
        max_position_embeddings=2560,
        initializer_range=0.5,  # logits that depend on the scaling (at 0.02 the attention is nearly uniform)
        rope_parameters=dict(rope_parameters),
    )
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return DeepseekV3ForCausalLM(cfg).eval()


def probed(model, ids):
    """(logits, the `scaling` every attention call received)."""
    seen = []
    with watch_sdpa(model, lambda module, q, k, mask, scaling, kwargs: seen.append(scaling)), torch.no_grad():
        logits = model(ids).logits
    return logits, seen


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal to float32's rounding: 1e-5 of the largest logit (about 11 here; the sums run over 32 channels)."""
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5 * float(want.abs().max()))


def yarn(factor: float, mscale: float, mscale_all_dim: float) -> dict:
    return {**SHIPPED, "factor": factor, "mscale": mscale, "mscale_all_dim": mscale_all_dim}


@pytest.mark.parametrize("target", [yarn(4.0, 0.707, 1.0), yarn(40.0, 1.0, 1.0), yarn(8.0, 1.0, 0.5)])
def test_the_scaling_ctxeval_sets_and_reads_back_is_deepseeks_own(target):
    """A model shipped with DeepSeek-V3's yarn, ctxeval's yarn applied with `target`'s parameters: the attention call's
    scaling, the record's read-back and the logits equal a DeepseekV3 built natively with `target` (same weights).
    Bug caught: the term not squared, m(s, mscale) used for mscale_all_dim, or the shipped factor not divided out of
    the base (then x 1.874 twice)."""
    shipped, native = deepseek(SHIPPED), deepseek(target)
    native.load_state_dict(shipped.state_dict())
    ids = torch.randint(0, 64, (1, 100))
    want_logits, want = probed(native, ids)
    params = {k: target[k] for k in ("factor", "mscale", "mscale_all_dim", "beta_fast", "beta_slow")}
    with apply_method(shipped, "yarn", original_max_position_embeddings=64, **params) as handle:
        got_logits, got = probed(shipped, ids)
        record = handle.record()
    m = 0.1 * target["mscale_all_dim"] * math.log(target["factor"]) + 1
    assert got == pytest.approx(want, rel=1e-12) and len(got) == 2
    assert got[0] == pytest.approx(16**-0.5 * m * m, rel=1e-12)
    assert record["softmax_scaling_readback"] == pytest.approx([want[0]], rel=1e-12)
    assert record["softmax_scale_factor"] == pytest.approx(m * m, rel=1e-12) and record["softmax_scale_modules"] == 2
    close(got_logits, want_logits)


def test_none_drops_the_shipped_term_and_exit_restores_it_exactly():
    """`-m none` on DeepSeek-V3 is plain RoPE: the softmax scale is qk_head_dim^-0.5, as DeepseekV3 with
    rope_type default computes; the shipped 0.25 x 1.874 comes back bit for bit. Bug caught: restore left out."""
    model = deepseek(SHIPPED)
    plain = deepseek({"rope_type": "default", "rope_theta": 10000.0})
    shipped = [layer.self_attn.scaling for layer in model.model.layers]
    ids = torch.randint(0, 64, (1, 40))
    with apply_method(model, "none"):
        _, got = probed(model, ids)
    assert got == [plain.model.layers[0].self_attn.scaling] * 2 == [0.25, 0.25]
    assert [layer.self_attn.scaling for layer in model.model.layers] == shipped
    assert shipped[0] == pytest.approx(0.25 * (0.1 * math.log(40) + 1) ** 2, rel=1e-12)


def test_deepseek_keys_on_a_full_rotary_head_equal_yarn_with_m_of_mscale():
    """No nope part (qk_nope_head_dim 0): rotary ratio m(s,a)/m(s,b) on q and k times the softmax's m(s,b)^2 is
    m(s,a)^2 on every logit, which is YaRN with attention factor m(s,a). Bug caught: the softmax term left out
    (logits off by m(s,b)^2) or applied as m(s,b) (not squared)."""
    model = deepseek(SHIPPED, nope=0)
    ids = torch.randint(0, 64, (1, 90))
    common = {"factor": 8.0, "original_max_position_embeddings": 64}
    with apply_method(model, "yarn", mscale=0.707, mscale_all_dim=1.3, **common):
        deepseek_logits, _ = probed(model, ids)
    with apply_method(model, "yarn", attention_factor=0.1 * 0.707 * math.log(8) + 1, **common):
        yarn_logits, _ = probed(model, ids)
    close(deepseek_logits, yarn_logits)
    with apply_method(model, "yarn", mscale=0.707, **common):  # mscale alone: YaRN's 0.1 ln s + 1, no softmax term
        other, _ = probed(model, ids)
    assert (other - yarn_logits).abs().max() > 0.1 * yarn_logits.abs().max()


def test_a_model_whose_attention_cannot_take_the_term_is_refused_in_one_line():
    """LlamaAttention has no DeepSeek softmax scale: yarn with mscale_all_dim is refused before anything changes;
    without it the same yarn applies. Bug caught: the refusal dropped (the rotary ratio alone applied silently)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=64,
    )
    model = LlamaForCausalLM(cfg).eval()
    before = model.model.rotary_emb.inv_freq.clone()
    with pytest.raises(CtxevalError) as caught:
        apply_method(model, "yarn", factor=4.0, mscale=1.0, mscale_all_dim=1.0)
    assert "\n" not in str(caught.value) and "LlamaAttention attention cannot take it" in str(caught.value)
    assert torch.equal(model.model.rotary_emb.inv_freq, before)
    with apply_method(model, "yarn", factor=4.0, mscale=1.0) as handle:
        assert "softmax_scale_factor" not in handle.record()
