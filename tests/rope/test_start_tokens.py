"""LongRoPE's start tokens (`start_token_idx`, microsoft/LongRoPE's "mixed" embedding): positions < n keep plain RoPE.

The reference is a transcription of microsoft/LongRoPE rope/longrope.py (MIT): LongRoPEScaledRotaryEmbedding's llama
forward (inv_freq = 1 / (factors * base^(2i/d)), cos/sin times the "su" magnitude sqrt(1 + ln s / ln L)) with
MixedLongRoPEScaledRotaryEmbedding's `_add_original_embeddings` (the first n positions' cos/sin replaced by the model's
original rotary embedding), installed in place of a fresh model's rotary forward."""

import math

import pytest
import torch
from helpers import TINY, tiny_llama

from ctxeval import apply_method
from ctxeval.errors import CtxevalError
from ctxeval.models.rope_config import rope_parameters
from ctxeval.rope.methods import Geometry
from ctxeval.specs import MethodSpec, expand_specs, identical_methods

L = TINY["max_position_embeddings"]
D = TINY["hidden_size"] // TINY["num_attention_heads"]  # head dim 16: 8 rotary pairs
PAIRS = D // 2
LONG = [1.0, 1.0, 1.2, 1.6, 2.1, 2.8, 3.4, 4.0]
SHORT = [1.0, 1.0, 1.0, 1.05, 1.1, 1.2, 1.3, 1.4]
S = 4.0


def microsoft_mixed(original, factors, n, scale, base=10000.0):
    """microsoft/LongRoPE's MixedLongRoPEScaledRotaryEmbedding (llama forward, 'su' magnitude), transcribed."""
    rescale = torch.tensor(factors, dtype=torch.float32)
    mscale = 1.0 if scale <= 1.0 else math.sqrt(1 + math.log(scale) / math.log(L))

    def forward(x, position_ids):
        exponent = torch.arange(0, D, 2, dtype=torch.float32) / D
        inv_freq = 1.0 / (rescale * (base**exponent))
        freqs = inv_freq[None, :, None].expand(position_ids.shape[0], -1, 1) @ position_ids[:, None, :].float()
        emb = torch.cat((freqs.transpose(1, 2),) * 2, dim=-1)
        cos, sin = emb.cos() * mscale, emb.sin() * mscale
        origin_cos, origin_sin = original(x, position_ids)
        cos[..., :n, :] = origin_cos[..., :n, :]
        sin[..., :n, :] = origin_sin[..., :n, :]
        return cos.to(x.dtype), sin.to(x.dtype)

    return forward


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("n", [1, 4, 17])
def test_start_tokens_equal_microsofts_mixed_embedding_past_the_trained_length(n):
    ids = torch.randint(0, TINY["vocab_size"], (1, 3 * L))
    model = tiny_llama()
    reference = tiny_llama()
    original = reference.model.rotary_emb.forward  # plain RoPE: the model's own embedding
    reference.model.rotary_emb.forward = microsoft_mixed(original, LONG, n, S)
    params = {"short_factor": SHORT, "long_factor": LONG, "factor": S, "start_token_idx": n}
    with apply_method(model, "longrope", **params) as handle:
        got = logits(model, ids)
        assert handle.start_tokens_max_abs_diff < 1e-5
    torch.testing.assert_close(got, logits(reference, ids), rtol=1e-5, atol=1e-5)
    with apply_method(model, "longrope", **{**params, "start_token_idx": 0}):
        without = logits(model, ids)
    assert (without - got).abs().max() > 1e-4  # keys at the first n positions changed


def test_start_tokens_up_to_the_trained_length_splice_plain_rope_into_the_short_factors():
    """Up to L transformers' longrope uses the short factors; the first n positions are plain RoPE there too."""
    n = 5
    ids = torch.randint(0, TINY["vocab_size"], (1, L))
    model = tiny_llama()
    rp = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": SHORT, "long_factor": LONG}
    reference = tiny_llama({**rp, "original_max_position_embeddings": L}, max_position_embeddings=int(S * L))
    reference.load_state_dict(model.state_dict())
    longrope = reference.model.rotary_emb.forward
    plain = tiny_llama().model.rotary_emb.forward

    def mixed(x, position_ids):
        cos, sin = longrope(x, position_ids)
        origin_cos, origin_sin = plain(x, position_ids)
        return (
            torch.cat([origin_cos[:, :n], cos[:, n:]], dim=1),
            torch.cat([origin_sin[:, :n], sin[:, n:]], dim=1),
        )

    reference.model.rotary_emb.forward = mixed
    with apply_method(model, "longrope", short_factor=SHORT, long_factor=LONG, factor=S, start_token_idx=n):
        got = logits(model, ids)
    torch.testing.assert_close(got, logits(reference, ids), rtol=1e-5, atol=1e-5)


def test_start_token_idx_0_is_plain_longrope_bit_for_bit():
    ids = torch.randint(0, TINY["vocab_size"], (1, 2 * L))
    model = tiny_llama()
    with apply_method(model, "longrope", short_factor=SHORT, long_factor=LONG, factor=S):
        want = logits(model, ids)
    with apply_method(model, "longrope", short_factor=SHORT, long_factor=LONG, factor=S, start_token_idx=0) as h:
        assert torch.equal(logits(model, ids), want)
        assert "start_tokens" not in h.record((2 * L,))


def test_a_model_that_ignores_the_start_tokens_fails_the_read_back():
    model = tiny_llama()
    handle = apply_method(model, "longrope", short_factor=SHORT, long_factor=LONG, factor=S, start_token_idx=3)
    assert handle.record((2 * L,))["start_tokens"]["n"] == 3
    handle._start_suspended = True  # as if the model's rotary output bypassed the hook
    with pytest.raises(CtxevalError, match="position 0 differs from longrope with start_token_idx=3"):
        handle.verify()
    assert not handle.active  # restored


def test_an_off_by_one_mask_fails_the_read_back():
    """Position n itself carries the method: a hook that also spliced plain RoPE into position n is caught."""
    model = tiny_llama()
    handle = apply_method(model, "longrope", short_factor=SHORT, long_factor=LONG, factor=S, start_token_idx=3)

    def one_too_many(module, args, kwargs, output):  # `position_ids <= n`
        handle.start_tokens = 4
        try:
            return type(handle)._start_hook(handle, module, args, kwargs, output)
        finally:
            handle.start_tokens = 3

    for hook in handle._hooks:
        hook.remove()
    handle._hooks = [m.register_forward_pre_hook(handle._pre_hook, with_kwargs=True) for _, m in handle.modules]
    handle._hooks += [m.register_forward_hook(one_too_many, with_kwargs=True) for _, m in handle.modules]
    with pytest.raises(CtxevalError, match="position 3 differs from longrope with start_token_idx=3"):
        handle.verify()


def test_start_tokens_are_refused_where_they_cannot_apply():
    with pytest.raises(CtxevalError, match="more positions than the trained length 64"):
        apply_method(tiny_llama(), "longrope", short_factor=SHORT, long_factor=LONG, factor=S, start_token_idx=64)
    with pytest.raises(CtxevalError, match="cannot be combined with an attention method"):
        expand_specs(["longrope:short_factor=1;1;1;1,long_factor=1;2;4;8,start_token_idx=4+self-extend"])
    spec = MethodSpec("longrope", {"short_factor": SHORT, "long_factor": LONG, "factor": S, "start_token_idx": 4})
    for use in ("--export", "--backend vllm"):
        with pytest.raises(CtxevalError, match=f"^{use}: .*neither transformers' nor vLLM's longrope"):
            rope_parameters(spec, Geometry(D, 10000.0, L), 4 * L, use)
    plain = MethodSpec("longrope", {"short_factor": SHORT, "long_factor": LONG, "factor": S})
    assert rope_parameters(plain, Geometry(D, 10000.0, L), 4 * L)["rope_type"] == "longrope"


def test_start_tokens_are_never_a_twin_of_the_same_frequencies():
    """Two longropes with equal factors but different start tokens measure differently: neither is copied."""
    specs = [
        MethodSpec("longrope", {"short_factor": SHORT, "long_factor": LONG, "factor": S}),
        MethodSpec("longrope", {"short_factor": SHORT, "long_factor": LONG, "factor": S, "start_token_idx": 4}),
        MethodSpec("longrope", {"short_factor": SHORT, "long_factor": LONG, "factor": S, "start_token_idx": 0}),
    ]
    twins = identical_methods(specs, [L, 2 * L], Geometry(D, 10000.0, L))
    assert specs[1].label not in twins
    assert twins == {specs[2].label: specs[0].label}
