"""Self-Extend, ReRoPE, leaky ReRoPE and log-n scaling (ctxeval/attention/methods.py, installed by attention/patching.py)
against the papers' formulas written out here on full L x L maps, end to end in a tiny random Llama (eager and
sdpa), composed with frequency methods, restored bit-exactly, and generating with a KV cache exactly as without."""

import math

import pytest
import torch
from conftest import tiny_llama

from ctxeval.attention.methods import attend, relative_position
from ctxeval.attention.patching import attention_methods, verify_attention_methods
from ctxeval.errors import CtxevalError
from ctxeval.rope.patching import apply_method, find_rotary_modules
from ctxeval.specs import expand_specs

# -------------------------------------------------------------------------------------------------------------------
# the papers' formulas, independently of ctxeval


def rope(x, pos, inv_freq):
    """RoPE (rotate-half layout) of x (..., D) at float positions pos (...,), on the first 2 * len(inv_freq) dims."""
    rd = 2 * len(inv_freq)
    angle = pos[..., None].double() * inv_freq.double()
    cos, sin = torch.cat([angle.cos()] * 2, -1), torch.cat([angle.sin()] * 2, -1)
    head, rest = x[..., :rd].double(), x[..., rd:].double()
    turned = torch.cat((-head[..., rd // 2 :], head[..., : rd // 2]), -1)
    return torch.cat((head * cos + turned * sin, rest), -1)


def positions(name, p, i, j):
    """(query position, key position) of pair (i, j): Self-Extend (Jin et al. 2024, eq. 3-4 / LongLM's patch), ReRoPE
    and leaky ReRoPE (Su 2023: score_ij = (q_i R_w) k_j for i - j >= w; leaky: distance w + (i - j - w) / k)."""
    d = i - j
    if name == "self-extend":
        g, w = p["group_size"], p["neighbor_window"]
        return (i, j) if d < w else (i // g + w - w // g, j // g)
    if name == "rerope":
        return (i, j) if d < p["window"] else (p["window"], 0)
    if name == "leaky-rerope":
        w, k = p["window"], p["k"]
        return (i, j) if d < w else (w + (i - w) / k, j / k)
    return i, j


def paper_attention(q, k, v, inv_freq, name, p, logn_length=None):
    """q (H, T, D), k/v (Hk, T, D) before RoPE, at positions 0..T-1; full L x L score map, causal softmax."""
    heads, t, dim = q.shape
    k, v = k.repeat_interleave(heads // k.shape[0], 0).double(), v.repeat_interleave(heads // k.shape[0], 0).double()
    scores = torch.full((heads, t, t), float("-inf"), dtype=torch.float64)
    for i in range(t):
        scale = max(1.0, math.log(i + 1) / math.log(logn_length)) if logn_length else 1.0
        for j in range(i + 1):
            pi, pj = positions(name, p, i, j)
            qi = rope(q[:, i] * scale, torch.tensor(float(pi)), inv_freq)
            kj = rope(k[:, j], torch.tensor(float(pj)), inv_freq)
            scores[:, i, j] = (qi * kj).sum(-1) / math.sqrt(dim)
    return torch.softmax(scores, -1) @ v  # (H, T, D)


def spec_of(text):
    return expand_specs([text])[0].attention


CASES = [
    ("self-extend:group_size=2,neighbor_window=8", None),
    ("self-extend:group_size=4,neighbor_window=16", None),
    ("self-extend:group_size=3,neighbor_window=7", None),  # W not a multiple of G
    ("rerope:window=8,logn=false", None),
    ("rerope:window=12", 16),  # Su's patch: logn on, L = 16 here
    ("leaky-rerope:window=8,k=4,logn=false", None),
    ("logn:length=16", 16),
    ("self-extend:group_size=2,neighbor_window=8+logn:length=16", 16),
]


@pytest.mark.parametrize("text,logn_length", CASES)
@pytest.mark.parametrize("rotary_pairs,chunk", [(8, None), (8, 5), (4, 7)])  # (4: partial rotary, half of D)
def test_attention_equals_the_papers_formula(text, logn_length, rotary_pairs, chunk):
    gen = torch.Generator().manual_seed(1)
    heads, kv_heads, t, dim = 4, 2, 40, 16
    q, k, v = (torch.randn(h, t, dim, generator=gen) for h in (heads, kv_heads, kv_heads))
    inv_freq = 1.0 / 10000 ** (torch.arange(0, 2 * rotary_pairs, 2, dtype=torch.float64) / (2 * rotary_pairs))
    specs = spec_of(text)
    remap = next((s for s in specs if s.name != "logn"), None)
    want = paper_attention(
        q, k, v, inv_freq, remap.name if remap else "none", remap.params if remap else {}, logn_length
    )
    pos = torch.arange(t)
    query = rope(q, pos.double(), inv_freq).float()[None]  # what RoPE hands the attention function
    key = rope(k, pos.double(), inv_freq).float()[None]
    got = attend(query, key, v[None], pos[None], pos[None], None, dim**-0.5, inv_freq, specs, 16, chunk=chunk)
    assert got.shape == (1, t, heads, dim)
    assert torch.allclose(got[0].transpose(0, 1).double(), want, atol=1e-5), text
    causal = torch.tril(torch.ones(t, t, dtype=torch.bool))[None, None]
    for mask in (causal, torch.zeros(1, 1, t, t).masked_fill(~causal, torch.finfo(torch.float32).min)):
        again = attend(query, key, v[None], pos[None], pos[None], mask, dim**-0.5, inv_freq, specs, 16, chunk=chunk)
        assert torch.allclose(again, got, atol=1e-6)  # bool, additive and implicit causal masks agree


def test_far_pairs_change_and_near_pairs_do_not():
    d = torch.arange(0, 40).double().numpy()
    (se,) = spec_of("self-extend:group_size=4,neighbor_window=16")
    assert (relative_position(se, d)[:16] == d[:16]).all() and relative_position(se, d)[39] == 39 // 4 + 16 - 4
    (rr,) = spec_of("rerope:window=8")
    assert relative_position(rr, d).max() == 8
    (lk,) = spec_of("leaky-rerope:window=8,k=4")
    assert relative_position(lk, d)[24] == 8 + 16 / 4


# -------------------------------------------------------------------------------------------------------------------
# in a model


def reference_attention_fn(inv_freq, name, p, logn_length=None):
    """An attention function computing the papers' formula from the post-RoPE q, k transformers hands it: rotate
    back to pre-RoPE (positions 0..T-1, prefill only), then paper_attention."""

    def fn(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        t = query.shape[2]
        pos = torch.arange(t).double()
        back = lambda x: rope(x, -pos, inv_freq())  # noqa: E731  (R(-i) undoes R(i))
        out = torch.stack(
            [
                paper_attention(back(query[b]), back(key[b]), value[b], inv_freq(), name, p, logn_length)
                for b in range(query.shape[0])
            ]
        )
        return out.transpose(1, 2).float(), None

    return fn


@pytest.mark.parametrize(
    "freq,text",
    [
        ("none", "self-extend:group_size=2,neighbor_window=8"),
        ("ntk:factor=2", "rerope:window=12,logn=false"),
        ("yarn:factor=2", "leaky-rerope:window=8,k=4,logn=false"),
    ],
)
def test_in_a_model_equals_the_reference_and_restores_exactly(freq, text):
    from transformers.modeling_utils import AttentionInterface

    model = tiny_llama()
    model.config._attn_implementation = "eager"
    ids = torch.randint(0, 128, (2, 40), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        before = model(input_ids=ids).logits
    spec = expand_specs([f"{freq}+{text}"])[0]
    rotary = find_rotary_modules(model)[0][1]
    inv = lambda: rotary.inv_freq  # noqa: E731
    mapping = AttentionInterface._global_mapping
    had_eager = "eager" in mapping
    with apply_method(model, spec.name, **spec.params), torch.inference_mode():
        with attention_methods(model, spec.attention, inv, 64):
            check = verify_attention_methods(model, spec.attention, inv, 64)
            got = model(input_ids=ids).logits
        (attn,) = spec.attention
        mapping["eager"] = reference_attention_fn(inv, attn.name, attn.params)
        try:
            want = model(input_ids=ids).logits
        finally:
            del mapping["eager"]
    assert check["layers_running_it"] == 2 and check["max_abs_diff_vs_reference"] < 1e-5
    assert torch.allclose(got, want, atol=1e-4) and not torch.allclose(got, before, atol=1e-3)
    assert ("eager" in mapping) == had_eager
    with torch.inference_mode():
        assert torch.equal(model(input_ids=ids).logits, before)  # restored bit-exactly


def test_sdpa_and_eager_paths_agree_and_other_implementations_are_refused():
    ids = torch.randint(0, 128, (1, 48), generator=torch.Generator().manual_seed(4))
    (spec,) = [expand_specs(["self-extend:group_size=4,neighbor_window=16"])[0]]
    logits = {}
    for impl in ("eager", "sdpa"):
        model = tiny_llama()
        model.config._attn_implementation = impl
        rotary = find_rotary_modules(model)[0][1]
        with attention_methods(model, spec.attention, lambda: rotary.inv_freq, 64), torch.inference_mode():
            logits[impl] = model(input_ids=ids).logits
    assert torch.allclose(logits["eager"], logits["sdpa"], atol=1e-5)
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(CtxevalError, match="for --attn sdpa or eager, not 'flash_attention_2'"):
        with attention_methods(model, spec.attention, lambda: rotary.inv_freq, 64):
            pass


def test_cached_generation_equals_recomputing_without_a_cache():
    model = tiny_llama()
    rotary = find_rotary_modules(model)[0][1]
    prompt = torch.randint(0, 128, (1, 20), generator=torch.Generator().manual_seed(5))
    for text in ("self-extend:group_size=2,neighbor_window=8", "rerope:window=6", "leaky-rerope:window=6,k=2"):
        spec = expand_specs([text])[0]
        with attention_methods(model, spec.attention, lambda: rotary.inv_freq, 16), torch.inference_mode():
            cached = model.generate(prompt, max_new_tokens=12, do_sample=False, use_cache=True, pad_token_id=0)
            ids = prompt
            for _ in range(12):  # every step a full forward over everything so far
                nxt = model(input_ids=ids, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
                ids = torch.cat([ids, nxt], 1)
        assert torch.equal(cached, ids), text


def test_bad_specs_are_one_line_errors():
    for text, message in (
        ("self-extend:group_size=0", "group_size must be >= 1"),
        ("self-extend:group_size=2.5", "group_size must be an integer"),
        ("self-extend:group_size=8,neighbor_window=4", "must be >= group_size"),
        ("rerope+self-extend", "combine at most one of"),
        ("logn+ntk", "one frequency method, written first"),
        ("rerope+logn", "already applies logn"),
        ("self-extend:window=3", "does not take 'window'"),
    ):
        with pytest.raises(CtxevalError, match=message):
            expand_specs([text])


def test_through_the_cli(tmp_path):
    import json

    from typer.testing import CliRunner

    from ctxeval.cli import app

    runner = CliRunner()
    out = tmp_path / "ppl"
    result = runner.invoke(
        app,
        [
            "ppl",
            "--model",
            "tiny",
            "--docs",
            "1",
            "--lengths",
            "128,256",
            "-m",
            "none",
            "-m",
            "self-extend:group_size=4,neighbor_window=64",
            "-m",
            "ntk:factor=2+logn",
            "-m",
            "rerope:window=512,logn=false",
            "--device",
            "cpu",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "note: rerope(logn=False,window=512): rerope's window 512 >= the longest length 256" in result.stderr
    record = json.loads((out / "run.json").read_text())
    check = record["methods"]["self-extend(group_size=4,neighbor_window=64)"]["attention_check"]
    assert check["layers_running_it"] == 4 and check["max_abs_diff_vs_reference"] < 1e-4
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    by = {(r["label"], r["length"]): r["value"] for r in rows}
    assert {r["method"] for r in rows} == {"none", "self-extend", "ntk+logn", "rerope"}
    assert by[("rerope(logn=False,window=512)", 256)] == pytest.approx(by[("none", 256)], rel=1e-5)  # a no-op here
    assert by[("self-extend(group_size=4,neighbor_window=64)", 256)] != pytest.approx(by[("none", 256)], rel=1e-3)
    needle = runner.invoke(
        app,
        [
            "needle",
            "--model",
            "tiny",
            "--lengths",
            "256",
            "--depths",
            "50",
            "--samples",
            "1",
            "-m",
            "leaky-rerope:window=64,k=4",
            "--device",
            "cpu",
            "--out",
            str(tmp_path / "n"),
        ],
    )
    assert needle.exit_code == 0, needle.output  # greedy generation with a KV cache under the method
    entropy = runner.invoke(app, ["entropy", "--model", "tiny", "-m", "rerope", "--out", str(tmp_path / "e")])
    assert entropy.exit_code == 2 and "entropy reads the q.k scores of plain attention" in entropy.stderr
