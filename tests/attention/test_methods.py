"""Self-Extend, ReRoPE, leaky ReRoPE and log-n scaling (ctxeval/attention/methods.py, installed by attention/patching.py)
against the papers' formulas written out here on full L x L maps, end to end in a tiny random Llama (eager and
sdpa), composed with frequency methods, restored bit-exactly, and generating with a KV cache exactly as without."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from helpers import tiny_llama

from ctxeval.attention.methods import attend, relative_position
from ctxeval.attention.patching import attention_methods, verify_attention_methods
from ctxeval.errors import CtxevalError
from ctxeval.rope.patching import apply_method, find_rotary_modules
from ctxeval.specs import expand_specs


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
        with (
            attention_methods(model, spec.attention, lambda rotary=rotary: rotary.inv_freq, 64),
            torch.inference_mode(),
        ):
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


def _att(name, **given):
    from ctxeval.attention.methods import resolve_attention

    return resolve_attention(name, given)


def test_an_unknown_attention_method_names_the_known_ones():
    from ctxeval.attention.methods import ATTENTION_METHODS, get_attention_method

    with pytest.raises(
        CtxevalError,
        match=r"^unknown attention method 'yarn'; choose one of: self-extend, rerope, "
        r"leaky-rerope, logn, dca, string, qscale-llama4, qscale-mistral$",
    ):
        get_attention_method("yarn")
    assert get_attention_method("rerope") is ATTENTION_METHODS["rerope"]
    assert [m.remaps for m in ATTENTION_METHODS.values()] == [True, True, True, False, True, True, False, False]


def test_attention_parameters_are_typed_and_defaults_filled():
    assert (_att("self-extend").params, _att("self-extend").given) == ({"group_size": 8, "neighbor_window": 1024}, {})
    assert _att("rerope").params == {"window": 512, "logn": True, "length": None}
    assert _att("leaky-rerope").params == {"window": 512, "k": 16.0, "logn": True, "length": None}
    assert _att("logn").params == {"length": None}
    spec = _att("leaky-rerope", window="64", k="4", logn="false")
    assert spec.params == {"window": 64, "k": 4.0, "logn": False, "length": None}
    assert spec.given == {"window": 64, "k": 4.0, "logn": False}
    assert type(spec.params["window"]) is int and type(spec.params["k"]) is float
    assert _att("logn", length=None).params == {"length": None}  # None: the model's trained length
    assert _att("self-extend", group_size=4, neighbor_window=4).params == {"group_size": 4, "neighbor_window": 4}


def test_bad_attention_parameters_are_one_line_errors():
    with pytest.raises(
        CtxevalError,
        match=r"^attention method 'rerope' does not take 'k'; it takes: window, logn, "
        r"length$",
    ):
        _att("rerope", k=2)
    with pytest.raises(
        CtxevalError,
        match=r"^self-extend: neighbor_window \(4\) must be >= group_size \(8\): the "
        r"grouped query position i//G \+ W - W//G assumes W >= G$",
    ):
        _att("self-extend", neighbor_window=4)
    with pytest.raises(CtxevalError, match=r"^self-extend: neighbor_window \(3\) must be >= group_size \(4\)"):
        _att("self-extend", group_size=4, neighbor_window=3)
    with pytest.raises(CtxevalError, match="leaky-rerope: k must be >= 1"):
        _att("leaky-rerope", k=0.5)


def test_attention_combinations():
    from ctxeval.attention.methods import check_combination

    check_combination((_att("self-extend"), _att("logn")))
    check_combination((_att("rerope", logn=False), _att("logn")))
    check_combination((_att("leaky-rerope"),))
    with pytest.raises(
        CtxevalError,
        match=r"^rerope and self-extend both change far pairs' positions; combine at most "
        r"one of self-extend, rerope, leaky-rerope \(with logn and a frequency "
        r"method\)$",
    ):
        check_combination((_att("rerope"), _att("logn"), _att("self-extend")))
    with pytest.raises(CtxevalError, match=r"^attention method given twice: logn\+logn$"):
        check_combination((_att("logn"), _att("logn")))
    with pytest.raises(
        CtxevalError,
        match=r"^leaky-rerope already applies logn \(its logn=true\); drop \+logn or set "
        r"logn=false$",
    ):
        check_combination((_att("leaky-rerope", window=8), _att("logn")))


def test_window_and_logn_length_of_each_method():
    from ctxeval.attention.methods import logn_length, window_of

    assert [
        window_of(s)
        for s in (
            _att("self-extend", neighbor_window=64),
            _att("rerope", window=32),
            _att("leaky-rerope", window=16),
            _att("logn"),
        )
    ] == [64, 32, 16, None]
    assert logn_length(_att("logn"), 4096) == 4096 and logn_length(_att("logn", length=100), 4096) == 100
    assert logn_length(_att("rerope"), 4096) == 4096 and logn_length(_att("rerope", length=8), 4096) == 8
    assert logn_length(_att("rerope", logn=False), 4096) is None
    assert logn_length(_att("self-extend"), 4096) is None


def test_noop_reason_says_why_the_methods_change_nothing():
    from ctxeval.attention.methods import noop_reason

    rerope = _att("rerope", window=512, logn=False)
    assert (
        noop_reason((rerope,), [128, 512], 64)
        == "rerope's window 512 >= the longest length 512: identical to the model without them"
    )
    assert noop_reason((rerope,), [513, 128], 64) is None
    assert noop_reason((_att("logn"),), [32, 64], 64) == "logn is 1 up to L=64: identical to the model without them"
    assert noop_reason((_att("logn"),), [65], 64) is None
    assert (
        noop_reason((_att("rerope", window=600),), [512], 512)
        == "rerope's window 600 >= the longest length 512; logn is 1 up to L=512: identical to the model without them"
    )
    assert noop_reason((_att("rerope", window=600),), [513], 512) is None  # logn scales past L
    assert (
        noop_reason((_att("self-extend", group_size=2, neighbor_window=8), _att("logn", length=8)), [8], 64)
        == "self-extend's window 8 >= the longest length 8; logn is 1 up to L=8: identical to the model without them"
    )
    assert noop_reason((_att("logn", length=8), _att("self-extend", group_size=2, neighbor_window=4)), [8], 64) is None


def test_far_positions_as_the_papers_write_them():
    from ctxeval.attention.methods import far_positions

    q, k = np.array([20, 21, 40]), np.array([0, 3, 9])
    got = far_positions(_att("self-extend", group_size=4, neighbor_window=10), q, k)
    assert [g.tolist() for g in got] == [[5 + 10 - 2, 5 + 8, 10 + 8], [0, 0, 2]]
    got = far_positions(_att("rerope", window=7), q, k)
    assert [g.tolist() for g in got] == [[7, 7, 7], [0, 0, 0]]
    got = far_positions(_att("leaky-rerope", window=8, k=4), q, k)
    assert [g.tolist() for g in got] == [[11.0, 11.25, 16.0], [0.0, 0.75, 2.25]]
    with pytest.raises(ValueError, match="^logn does not remap positions$"):
        far_positions(_att("logn"), q, k)


def test_relative_positions_of_each_method():
    from ctxeval.attention.methods import relative_position

    d = np.arange(0, 40, 3)  # 0, 3, ..., 39
    assert relative_position(_att("logn"), d).tolist() == d.tolist()
    se = relative_position(_att("self-extend", group_size=4, neighbor_window=10), d)
    assert se.tolist() == [x if x < 10 else x // 4 + 10 - 2 for x in d]
    assert relative_position(_att("rerope", window=9), d).tolist() == [min(x, 9) for x in d]
    leaky = relative_position(_att("leaky-rerope", window=9, k=2), d)
    assert leaky.tolist() == [x if x < 9 else 9 + (x - 9) / 2 for x in d]
    assert relative_position(_att("rerope", window=9), [9]).tolist() == [9.0]


def test_pair_positions_change_from_the_window_on():
    import torch

    from ctxeval.attention.methods import pair_positions

    qi, kj = torch.tensor([10, 10, 10, 10]), torch.tensor([0, 1, 2, 10])  # distances 10, 9, 8, 0
    q, k = pair_positions(_att("rerope", window=9), qi, kj)
    assert q.dtype == torch.float64 and q.tolist() == [9, 9, 10, 10] and k.tolist() == [0, 0, 2, 10]
    q, k = pair_positions(_att("logn"), qi, kj)
    assert q.dtype == k.dtype == torch.float64 and q.tolist() == [10] * 4 and k.tolist() == [0, 1, 2, 10]


def test_logn_scale_is_one_up_to_the_trained_length_and_log_ratio_past_it():
    import math

    import torch

    from ctxeval.attention.methods import logn_scale

    got = logn_scale(torch.tensor([[0, 14, 15, 16, 255]]), 16)
    assert got.dtype == torch.float64
    assert got.tolist() == [[1.0, 1.0, 1.0, pytest.approx(math.log(17) / math.log(16)), pytest.approx(2.0)]]


@pytest.mark.parametrize(
    "text",
    [
        "logn",
        "rerope:window=6",
        "leaky-rerope:window=6,k=2,logn=false",
        "self-extend:group_size=2,neighbor_window=4+logn:length=8",
    ],
)
def test_the_reference_probe_equals_attend_with_logn_past_its_length(text):
    """reference_attention (the probe's per-pair float64 formula) and attend (the chunked kernel) agree, logn's
    query scaling included: positions run past L = 8 (the trained length, logn's default), where the scale exceeds 1."""
    import torch

    from ctxeval.attention.methods import attend, reference_attention, rotate
    from ctxeval.specs import expand_specs

    specs = expand_specs([text])[0].attention
    g = torch.Generator().manual_seed(2)
    heads, t, dim = 2, 24, 8
    q_raw, k_raw, v = (torch.randn(heads, t, dim, generator=g, dtype=torch.float64) for _ in range(3))
    pos = torch.arange(t)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    ref = reference_attention(q_raw, k_raw, v, pos, pos, inv_freq, specs, dim**-0.5, 8)
    q, k = rotate(q_raw[None], pos[None], inv_freq), rotate(k_raw[None], pos[None], inv_freq)
    got = attend(q, k, v[None], pos[None], pos[None], None, dim**-0.5, inv_freq, specs, 8)[0]
    assert float((ref - got).abs().max()) < 1e-5
    plain = reference_attention(q_raw, k_raw, v, pos, pos, inv_freq, (), dim**-0.5, 8)
    assert float((ref[9:] - plain[9:]).abs().max()) > 1e-3 and float((ref[:4] - plain[:4]).abs().max()) < 1e-12


def _attend_inputs(batch=1, heads=4, kv=2, t=12, dim=8, dtype=None, seed=3):
    import torch

    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, h, t, dim, generator=g) for h in (heads, kv, kv))
    if dtype is not None:
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    pos = torch.arange(t)[None] + 5 * torch.arange(batch)[:, None]  # each sequence at its own positions
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    return q, k, v, pos, inv_freq


@pytest.mark.parametrize("text", ["self-extend:group_size=2,neighbor_window=4", "leaky-rerope:window=4,k=2"])
def test_attend_on_a_batch_equals_each_sequence_alone(text):
    import torch

    from ctxeval.attention.methods import attend
    from ctxeval.specs import expand_specs

    specs = expand_specs([text])[0].attention
    q, k, v, pos, inv_freq = _attend_inputs(batch=2)
    both = attend(q, k, v, pos, pos, None, 0.35, inv_freq, specs, 8)
    for b in (0, 1):
        alone = attend(
            q[b : b + 1], k[b : b + 1], v[b : b + 1], pos[b : b + 1], pos[b : b + 1], None, 0.35, inv_freq, specs, 8
        )
        torch.testing.assert_close(both[b : b + 1], alone, atol=1e-6, rtol=1e-6)


def test_attend_returns_the_querys_dtype():
    import torch

    from ctxeval.attention.methods import attend
    from ctxeval.specs import expand_specs

    q, k, v, pos, inv_freq = _attend_inputs(dtype=torch.float64)
    out = attend(q, k, v, pos, pos, None, 0.35, inv_freq, expand_specs(["rerope:window=4"])[0].attention, 8)
    assert out.dtype == torch.float64 and out.shape == (1, 12, 4, 8)


@pytest.mark.parametrize("text, maps", [("rerope:window=4", 2), ("logn:length=4", 1)])
def test_attends_query_chunk_is_the_largest_the_score_budget_allows(monkeypatch, text, maps):
    """float32 score maps (both maps of a remapping method, and the probabilities) of a chunk fit the budget: a budget
    of exactly 3 queries' worth gives chunks of 3, a budget under one query's chunks of 1; the output is the same."""
    import torch

    from ctxeval.attention import methods as A
    from ctxeval.specs import expand_specs

    specs = expand_specs([text])[0].attention
    q, k, v, pos, inv_freq = _attend_inputs()
    full = A.attend(q, k, v, pos, pos, None, 0.35, inv_freq, specs, 8)
    real, rows = torch.softmax, []

    def recording(x, dim):
        rows.append(x.shape[-2])
        return real(x, dim=dim)

    monkeypatch.setattr(torch, "softmax", recording)
    for budget, want in ((1 * 4 * 12 * 4 * (maps + 1) * 3, [3, 3, 3, 3]), (100, [1] * 12)):
        rows.clear()
        monkeypatch.setattr(A, "SCORE_BUDGET_BYTES", budget)
        out = A.attend(q, k, v, pos, pos, None, 0.35, inv_freq, specs, 8)
        assert rows == want
        torch.testing.assert_close(out, full, atol=1e-6, rtol=1e-6)
