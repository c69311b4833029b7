"""The fast paths of the attention methods (ctxeval/attention/kernels.py) against the exact chunked reference
(attention_methods.attend, itself tested against the papers' formulas in attention/test_methods.py): the fused
near/far split merged by log-sum-exp, log-n as query scaling on the model's own attention function, left padding,
the far-key cache of decoding, and the choice of kernel recorded in run.json."""

import json

import pytest
import torch
from helpers import tiny_llama, tiny_neox

import ctxeval.attention.kernels as kernels
from ctxeval.attention.kernels import (
    FarKeyCache,
    MaskVerdicts,
    attention_with_lse,
    choose_kernel,
    fused_attend,
    key_starts,
    merge_into,
)
from ctxeval.attention.methods import attend
from ctxeval.attention.patching import attention_methods, kernel_of, verify_attention_methods
from ctxeval.errors import CtxevalError
from ctxeval.rope.patching import find_rotary_modules
from ctxeval.specs import expand_specs

SPECS = [
    "self-extend:group_size=4,neighbor_window=64",
    "self-extend:group_size=3,neighbor_window=50",  # W not a multiple of G, and divides no length below
    "self-extend:group_size=2,neighbor_window=16+logn:length=64",
    "rerope:window=100,logn=false",
    "rerope:window=37",  # Su's log-n on, L = 64
    "leaky-rerope:window=37,k=4,logn=false",
    "leaky-rerope:window=300,k=16,logn=false",
]


def inputs(batch=1, heads=4, kv_heads=2, keys=700, queries=None, dim=16, pairs=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, keys, dim, generator=gen)[:, :, keys - (queries or keys) :]
    k, v = (torch.randn(batch, kv_heads, keys, dim, generator=gen) for _ in range(2))
    inv_freq = 1.0 / 10000 ** (torch.arange(0, 2 * pairs, 2, dtype=torch.float64) / (2 * pairs))
    k_pos = torch.arange(keys)[None].expand(batch, keys)
    return q, k, v, k_pos[:, keys - (queries or keys) :], k_pos, inv_freq


@pytest.mark.parametrize("text", SPECS)
@pytest.mark.parametrize(
    "shape",
    [
        dict(),
        dict(queries=1),
        dict(queries=77),
        dict(keys=1000, dim=32, pairs=12),
        dict(heads=6, kv_heads=1, keys=333),
        dict(heads=4, kv_heads=4, keys=129),
    ],
)
def test_fused_equals_the_chunked_reference(text, shape, monkeypatch):
    """Prefill (queries = keys), a decoding step (1 query), a chunk after a cache (77), partial rotary (12 of 16
    pairs), grouped-query heads (6 on 1 key head), lengths no block or window divides."""
    monkeypatch.setattr(kernels, "NEAR_BLOCK", 48)  # many near blocks at these lengths, the last one partial
    q, k, v, q_pos, k_pos, inv_freq = inputs(**shape)
    specs = expand_specs([text])[0].attention
    want = attend(q, k, v, q_pos, k_pos, None, q.shape[-1] ** -0.5, inv_freq, specs, 64)
    got = fused_attend(q, k, v, q_pos, k_pos, None, q.shape[-1] ** -0.5, inv_freq, specs, 64)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert (got - want).abs().max() < 1e-5


def test_merge_is_one_softmax_over_the_union_of_keys():
    gen = torch.Generator().manual_seed(2)
    q, k, v = (
        torch.randn(1, 2, 5, 8, generator=gen),
        torch.randn(1, 2, 30, 8, generator=gen),
        torch.randn(1, 2, 30, 8, generator=gen),
    )
    parts = [attention_with_lse(q, k[:, :, a:b], v[:, :, a:b], 0.3) for a, b in ((0, 4), (4, 21), (21, 30))]
    scores = (q @ k.transpose(-1, -2)) * 0.3
    assert torch.allclose(parts[1][1], torch.logsumexp(scores[..., 4:21], -1), atol=1e-5)
    out, lse = parts[0]
    for part in parts[1:]:
        merge_into(out, lse, *part)
    assert torch.allclose(out, torch.softmax(scores, -1) @ v, atol=1e-6)
    assert torch.allclose(lse, torch.logsumexp(scores, -1), atol=1e-5)


def padded_mask(starts, tq, tk):
    offset = tk - tq
    keys, queries = torch.arange(tk), torch.arange(offset, tk)[:, None]
    return torch.stack([((keys >= s) & (keys <= queries))[None] for s in starts])  # (B, 1, Tq, Tk)


def test_left_padding_is_recognised_and_other_masks_go_to_the_reference():
    starts = [0, 17, 140]
    mask = padded_mask(starts, 300, 300)
    assert key_starts(mask, 300, 300) == starts
    assert (
        key_starts(torch.zeros(3, 1, 300, 300).masked_fill(~mask, torch.finfo(torch.float32).min), 300, 300) == starts
    )
    assert key_starts(padded_mask(starts, 1, 300), 1, 300) == starts  # a decoding step
    right = padded_mask([0, 0, 0], 300, 300)
    right[1, :, :, 250:] = False  # right padding
    assert key_starts(right, 300, 300) is None
    bias = torch.zeros(3, 1, 300, 300).masked_fill(~mask, -1e30)
    bias[0, 0, 5, 2] = -0.5  # a bias, not a mask
    assert key_starts(bias, 300, 300) is None

    q, k, v, _, _, inv_freq = inputs(batch=3, keys=300)
    k_pos = torch.arange(300)[None] - torch.tensor(starts)[:, None]  # real tokens start at position 0
    specs = expand_specs(["self-extend:group_size=4,neighbor_window=64"])[0].attention
    for m in (mask, right):
        want = attend(q, k, v, k_pos, k_pos, m, 0.25, inv_freq, specs, 64)
        got = fused_attend(q, k, v, k_pos, k_pos, m, 0.25, inv_freq, specs, 64)
        for b, s in enumerate(starts):  # rows of padding are never read: compare the real ones
            assert (got[b, s:] - want[b, s:]).abs().max() < 1e-5


def test_mask_verdicts_are_computed_once_per_mask_object(monkeypatch):
    """Bugs caught: a verdict computed per layer (calls > 1 for one mask), a mask changed in place between calls
    served the old verdict (the version check dropped: the same object is passed again, with no other mask
    between), or another mask object served the last one's verdict."""
    calls = []
    real = kernels.key_starts
    monkeypatch.setattr(kernels, "key_starts", lambda m, tq, tk: calls.append(1) or real(m, tq, tk))
    verdicts, mask = MaskVerdicts(), padded_mask([0], 8, 8)
    for _ in range(4):
        assert verdicts.starts(mask, 8, 8) == [0]
    assert len(calls) == 1
    mask[0, 0, :, :3] = False  # changed in place into 3 tokens of left padding: its version moves on
    assert verdicts.starts(mask, 8, 8) == [3] and len(calls) == 2
    assert verdicts.starts(padded_mask([5], 8, 8), 8, 8) == [5] and len(calls) == 3


def test_a_bias_on_a_masked_key_that_is_not_minus_infinity_goes_to_the_reference():
    """An additive mask whose masked keys are large negative numbers is a mask, but one masked key at -5 is a bias:
    that key still gets exp(-5) of the weight, so the fused path (which drops masked keys) must not take it. Bug
    caught: the bias check in key_starts dropped (the structure of the zeros alone looks like left padding)."""
    starts = [0, 17]
    mask = padded_mask(starts, 64, 64)
    bias = torch.zeros(2, 1, 64, 64).masked_fill(~mask, torch.finfo(torch.float32).min)
    assert key_starts(bias, 64, 64) == starts
    bias[1, 0, 40, 3] = -5.0  # a masked key (before the real tokens) with a finite bias
    assert key_starts(bias, 64, 64) is None
    q, k, v, _, _, inv_freq = inputs(batch=2, keys=64)
    pos = torch.arange(64)[None] - torch.tensor(starts)[:, None]
    specs = expand_specs(["self-extend:group_size=4,neighbor_window=16"])[0].attention
    want = attend(q, k, v, pos, pos, bias, 0.25, inv_freq, specs, 16)
    got = fused_attend(q, k, v, pos, pos, bias, 0.25, inv_freq, specs, 16)
    assert (got[1, 17:] - want[1, 17:]).abs().max() < 1e-5


def test_far_key_cache_serves_decoding_steps_and_starts_afresh():
    specs = expand_specs(["self-extend:group_size=4,neighbor_window=32"])[0].attention
    q, k, v, _, k_pos, inv_freq = inputs(keys=200)
    layer, cache = object.__new__(type("Layer", (), {})), FarKeyCache()
    rotated = []
    real_rotate = kernels.rotate
    kernels.rotate = lambda x, delta, f: rotated.append(x.shape[2]) or real_rotate(x, delta, f)
    try:
        fused_attend(
            q[:, :, :150],
            k[:, :, :150],
            v[:, :, :150],
            k_pos[:, :150],
            k_pos[:, :150],
            None,
            0.25,
            inv_freq,
            specs,
            64,
            module=layer,
            cache=cache,
        )
        assert layer not in cache.layers  # a prefill stores nothing (ppl never decodes)
        for t in range(150, 200):  # decoding steps: one new key each
            got = fused_attend(
                q[:, :, t : t + 1],
                k[:, :, : t + 1],
                v[:, :, : t + 1],
                k_pos[:, t : t + 1],
                k_pos[:, : t + 1],
                None,
                0.25,
                inv_freq,
                specs,
                64,
                module=layer,
                cache=cache,
            )
            want = attend(
                q[:, :, t : t + 1],
                k[:, :, : t + 1],
                v[:, :, : t + 1],
                k_pos[:, t : t + 1],
                k_pos[:, : t + 1],
                None,
                0.25,
                inv_freq,
                specs,
                64,
            )
            assert (got - want).abs().max() < 1e-5
    finally:
        kernels.rotate = real_rotate
    far_key_rotations = rotated[1::2]  # each call rotates q, then keys
    assert far_key_rotations == [150, 151] + [1] * 49  # prefill; all once at the first step; then the new key only
    # a step of another sequence whose earlier keys are as many as the cache holds is not served stale far keys:
    # its last earlier key differs
    gen = torch.Generator().manual_seed(9)
    other, other_v = torch.randn(1, 2, 201, 16, generator=gen), torch.randn(1, 2, 201, 16, generator=gen)
    pos = torch.arange(201)[None]
    got = fused_attend(
        q[:, :, -1:], other, other_v, pos[:, 200:], pos, None, 0.25, inv_freq, specs, 64, module=layer, cache=cache
    )
    want = attend(q[:, :, -1:], other, other_v, pos[:, 200:], pos, None, 0.25, inv_freq, specs, 64)
    assert cache.layers[layer].count == 201 and (got - want).abs().max() < 1e-5


# -------------------------------------------------------------------------------------------------------------------
# in a model


def run_model(model, text, ids, kernel, monkeypatch, **generate):
    monkeypatch.setenv(kernels.KERNEL_ENV, kernel)
    spec = expand_specs([text])[0]
    rotary = find_rotary_modules(model)[0][1]
    with attention_methods(model, spec.attention, lambda: rotary.inv_freq, 64), torch.inference_mode():
        if generate:
            return model.generate(ids, do_sample=False, pad_token_id=0, **generate)
        return model(input_ids=ids).logits


@pytest.mark.parametrize(
    "text",
    [
        "self-extend:group_size=4,neighbor_window=24",
        "rerope:window=30",
        "leaky-rerope:window=20,k=4,logn=false",
        "logn:length=32",
        "self-extend:group_size=2,neighbor_window=10+logn:length=32",
        "dca:chunk_size=30,local_size=7",
        "dca:chunk_size=26,local_size=4,scale=vllm,original=40",
        "string:shift=23,local=5",
    ],
)
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("arch", ["llama", "gpt-neox"])
def test_in_a_model_fast_equals_chunked_forward_and_generation(text, impl, arch, monkeypatch):
    model = tiny_llama() if arch == "llama" else tiny_neox()
    model.config._attn_implementation = impl
    ids = torch.randint(0, 128, (2, 100), generator=torch.Generator().manual_seed(3))
    fast = run_model(model, text, ids, "", monkeypatch)
    exact = run_model(model, text, ids, "chunked", monkeypatch)
    assert (fast - exact).abs().max() < 1e-5
    prompt = ids[:1, :60]
    assert torch.equal(
        run_model(model, text, prompt, "", monkeypatch, max_new_tokens=20),
        run_model(model, text, prompt, "chunked", monkeypatch, max_new_tokens=20),
    )
    padded = torch.cat([torch.zeros(1, 13, dtype=torch.long), ids[1:, :47]], 1)  # a left-padded batch of two
    mask = torch.ones(2, 60, dtype=torch.long)
    mask[1, :13] = 0
    batch = torch.cat([prompt, padded])
    assert torch.equal(
        run_model(model, text, batch, "", monkeypatch, attention_mask=mask, max_new_tokens=12),
        run_model(model, text, batch, "chunked", monkeypatch, attention_mask=mask, max_new_tokens=12),
    )


def test_log_n_alone_runs_the_models_own_attention_function(monkeypatch):
    import ctxeval.attention.methods as methods

    model = tiny_llama()
    ids = torch.randint(0, 128, (1, 90), generator=torch.Generator().manual_seed(4))
    exact = run_model(model, "logn:length=32", ids, "chunked", monkeypatch)
    monkeypatch.setattr(methods, "attend", lambda *a, **k: pytest.fail("log-n left the model's attention function"))
    for impl in ("sdpa", "eager"):
        model.config._attn_implementation = impl
        assert (run_model(model, "logn:length=32", ids, "", monkeypatch) - exact).abs().max() < 1e-5


def test_the_kernel_is_chosen_in_one_place_and_recorded(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from ctxeval.cli import app

    spec = expand_specs(["self-extend+logn"])[0].attention
    assert choose_kernel(spec, "cpu") == "fused" and choose_kernel(spec, "cuda") == "fused"
    assert choose_kernel(spec, "mps") == "chunked"
    assert choose_kernel(expand_specs(["ntk:factor=2+logn"])[0].attention, "cpu") == "query-scale"
    monkeypatch.setenv(kernels.KERNEL_ENV, "chunked")
    assert choose_kernel(spec, "cpu") == "chunked" and kernel_of(tiny_llama(), spec) == "chunked"
    monkeypatch.delenv(kernels.KERNEL_ENV)

    monkeypatch.setenv(kernels.KERNEL_ENV, "chunk")  # a typo is refused in one line, through the CLI too
    with pytest.raises(CtxevalError, match="is not a kernel choice"):
        choose_kernel(spec, "cpu")
    typo = CliRunner().invoke(
        app,
        [
            "ppl",
            "--model",
            "tiny",
            "--docs",
            "1",
            "--lengths",
            "256",
            "-m",
            "rerope:window=64",
            "--device",
            "cpu",
            "--out",
            str(tmp_path / "typo"),
        ],
    )
    assert typo.exit_code == 2 and "is not a kernel choice" in typo.stderr and "Traceback" not in typo.output
    monkeypatch.delenv(kernels.KERNEL_ENV)

    model = tiny_llama()
    rotary = find_rotary_modules(model)[0][1]
    with attention_methods(model, spec, lambda: rotary.inv_freq, 64):
        check = verify_attention_methods(model, spec, lambda: rotary.inv_freq, 64)
    assert check["attention_kernel"] == "fused" and check["max_abs_diff_vs_reference"] < 1e-5

    out = tmp_path / "ppl"
    result = CliRunner().invoke(
        app,
        [
            "ppl",
            "--model",
            "tiny",
            "--docs",
            "1",
            "--lengths",
            "256",
            "-m",
            "rerope:window=64",
            "-m",
            "ntk:factor=2+logn",
            "--device",
            "cpu",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    methods = json.loads((out / "run.json").read_text())["methods"]
    assert methods["rerope(window=64)"]["attention_kernel"] == "fused"
    assert methods["ntk(factor=2)+logn"]["attention_kernel"] == "query-scale"


def test_dry_run_counts_each_kernels_workspace_and_the_far_key_cache(monkeypatch):
    from transformers import LlamaConfig

    from ctxeval.attention.methods import SCORE_BUDGET_BYTES
    from ctxeval.models.memory import estimate

    cfg = LlamaConfig(
        hidden_size=576,
        num_attention_heads=9,
        num_key_value_heads=3,
        num_hidden_layers=30,
        intermediate_size=1536,
        vocab_size=49152,
    )
    L, b, q, k = 16384, 4, 16384 * 9 * 64, 16384 * 3 * 64
    (plain,) = estimate(cfg, (L,), "float32", "sdpa", 1024)
    rerope = expand_specs(["rerope:window=2048"])[0].attention
    logn = expand_specs(["ntk:factor=2+logn"])[0].attention
    (fused,) = estimate(cfg, (L,), "float32", "sdpa", 1024, (rerope, logn, ()))
    assert fused.attention - plain.attention == (3 * q + k) * b + 2 * q * 4 + 256 * (256 + 2048) * 4
    assert fused.kv_cache - plain.kv_cache == 30 * k * b  # one more key tensor per layer
    (scaled,) = estimate(cfg, (L,), "float32", "sdpa", 1024, (logn,))
    assert scaled.attention - plain.attention == q * b and scaled.kv_cache == plain.kv_cache
    monkeypatch.setenv(kernels.KERNEL_ENV, "chunked")
    (chunked,) = estimate(cfg, (L,), "float32", "sdpa", 1024, (rerope,))
    assert chunked.attention - plain.attention == SCORE_BUDGET_BYTES + (q + 3 * k) * 4 + q * b
    assert chunked.kv_cache == plain.kv_cache
