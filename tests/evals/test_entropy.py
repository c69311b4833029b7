"""Attention entropy: the chunked sdpa capture equals entropies from eager attention maps, leaves the model's output
unchanged, one forward serves every shorter length, and the CLI writes a resumable run with table and plot."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers import tiny_llama
from typer.testing import CliRunner

from ctxeval.attention.patching import attention_temperature
from ctxeval.cli import app
from ctxeval.data.corpora import TokenDoc
from ctxeval.errors import CtxevalError
from ctxeval.evals.entropy import EntropyConfig, EntropyRunner, capture, uniform_entropy
from ctxeval.specs import expand_specs

runner = CliRunner()


N = 48


def _pair():
    sdpa = tiny_llama(num_hidden_layers=2, attn_implementation="sdpa")
    eager = tiny_llama(num_hidden_layers=2, attn_implementation="eager")
    return sdpa, eager


def _ids(n=N, seed=0):
    return torch.randint(3, 100, (1, n), generator=torch.Generator().manual_seed(seed))


def _eager_entropy(model, ids, heads=None):
    """Per layer: mean over heads and queries of -sum p ln p, from the full eager attention maps."""
    with torch.inference_mode():
        att = model(ids, output_attentions=True).attentions
    out = []
    for a in att:  # [1, H, q, k]
        p = a[0].double() if heads is None else a[0, heads].double()
        ent = -(p * torch.where(p > 0, p.log(), torch.zeros_like(p))).sum(-1)  # [H, q]
        out.append(ent.mean(0))
    return out


@pytest.mark.parametrize("chunk", [N, 7])
def test_capture_equals_eager_attention_entropy(chunk):
    sdpa, eager = _pair()
    ids = _ids()
    with torch.inference_mode():
        plain = sdpa(ids).logits
        with capture(sdpa, EntropyConfig((N,), query_chunk=chunk)) as cap:
            seen = sdpa(ids).logits
    assert torch.equal(plain, seen)  # measuring changes nothing
    want = _eager_entropy(eager, ids)
    assert sorted(cap.per_layer) == [0, 1]
    for layer in (0, 1):
        torch.testing.assert_close(cap.per_layer[layer], want[layer], atol=1e-5, rtol=1e-5)


def test_layer_and_head_sampling_and_temperature():
    sdpa, eager = _pair()
    ids = _ids()
    with torch.inference_mode(), capture(sdpa, EntropyConfig((N,), layers=(1,), heads=(0, 2))) as cap:
        sdpa(ids)
    assert list(cap.per_layer) == [1]
    torch.testing.assert_close(cap.per_layer[1], _eager_entropy(eager, ids, heads=[0, 2])[1], atol=1e-5, rtol=1e-5)
    with torch.inference_mode(), capture(sdpa, EntropyConfig((N,))) as cap:
        sdpa(ids)
        cold = {k: v.clone() for k, v in cap.per_layer.items()}
        with attention_temperature(sdpa, 3.0), attention_temperature(eager, 3.0):
            cap.reset()
            sdpa(ids)
            torch.testing.assert_close(cap.per_layer[0], _eager_entropy(eager, ids)[0], atol=1e-5, rtol=1e-5)
    assert float(cap.per_layer[0][1:].mean()) < float(cold[0][1:].mean())  # sharper logits, lower entropy


def test_one_forward_serves_every_shorter_length():
    sdpa, _ = _pair()
    doc = TokenDoc("d", np.arange(5, 5 + 2 * N) % 100)
    cfg = EntropyConfig((16, 32, N))
    rows = []
    r = EntropyRunner(sdpa, "cpu", cfg, 1, "tiny")
    spec = expand_specs(["none"])[0]
    with capture(sdpa, cfg) as cap:
        r.measure(spec, doc, [16, 32, N], cap, rows.extend)
        separate = []
        r.measure(spec, doc, [16], cap, separate.extend)
    by = {row["length"]: row for row in rows}
    assert by[16]["entropy"] == pytest.approx(separate[0]["entropy"], abs=1e-6)
    assert by[N]["uniform_entropy"] == pytest.approx(np.mean(np.log(np.arange(1, N + 1))))
    assert by[16]["entropy"] < by[N]["entropy"] < by[N]["uniform_entropy"]


def test_uniform_entropy():
    assert uniform_entropy(1) == 0.0
    assert uniform_entropy(3) == pytest.approx((0 + np.log(2) + np.log(3)) / 3)


def test_cli_entropy_run_and_resume(tmp_path, tiny_model_dir, text_dir):
    args = [
        "entropy",
        "--model",
        str(tiny_model_dir),
        "--data",
        str(text_dir),
        "--lengths",
        "32,64,128",
        "-m",
        "none",
        "-m",
        "yarn:factor=2",
        "-m",
        "dynamic-ntk",
        "--out",
        str(tmp_path / "e"),
    ]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    rows = [json.loads(x) for x in (tmp_path / "e" / "rows.jsonl").read_text().splitlines()]
    assert len(rows) == 9 and all(r["status"] == "ok" and len(r["entropy_per_layer"]) == 2 for r in rows)
    assert (tmp_path / "e" / "entropy.png").stat().st_size > 0
    table = (tmp_path / "e" / "table.md").read_text()
    assert "yarn(factor=2)" in table and "uniform" in table and "## Per layer" in table
    again = runner.invoke(app, args)
    assert again.exit_code == 0
    assert len((tmp_path / "e" / "rows.jsonl").read_text().splitlines()) == 9  # nothing re-measured
    bad = runner.invoke(app, [*args[:-2], "--layers", "5", "--out", str(tmp_path / "f")])
    assert bad.exit_code == 2 and "--layers must be in 0..1" in bad.output


def test_out_of_memory_at_the_longest_length_falls_back_to_shorter_forwards():
    from ctxeval.evals.common import PointOOM

    sdpa, _ = _pair()
    doc = TokenDoc("d", np.arange(5, 5 + 2 * N) % 100)
    cfg = EntropyConfig((16, 32, N))
    r = EntropyRunner(sdpa, "cpu", cfg, 1, "tiny")
    real = r._forward

    def forward(cap, doc, length):
        if length > 32:
            raise PointOOM("out of memory (injected)")
        return real(cap, doc, length)

    r._forward = forward
    rows = []
    with capture(sdpa, cfg) as cap:
        r.measure(expand_specs(["none"])[0], doc, [16, 32, N], cap, rows.extend)
    assert {(row["length"], row["status"]) for row in rows} == {(16, "ok"), (32, "ok"), (N, "oom")}


def test_native_is_length_dependent_only_for_a_shipped_dynamic_rope():
    from types import SimpleNamespace

    from ctxeval.evals.sweep import length_dependent
    from ctxeval.rope.geometry import rope_info_from_config

    native = expand_specs(["native"])[0]
    plain = SimpleNamespace(rope=rope_info_from_config(tiny_llama().config))
    dynamic = SimpleNamespace(
        rope=rope_info_from_config(
            tiny_llama(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}).config
        )
    )
    assert not length_dependent(native, plain) and length_dependent(native, dynamic)
    assert length_dependent(expand_specs(["dynamic-ntk"])[0], plain)


def test_a_byte_budget_bounds_the_chunk_and_changes_nothing(monkeypatch):
    """The capture reads each key/value head once for its query group (no expanded k) and sizes the query chunk so
    that scores + probabilities fit the budget; the entropies equal eager attention's either way."""
    sdpa, eager = _pair()
    ids = _ids()
    shapes = []
    real = torch.einsum

    def recording(eq, *ops):
        out = real(eq, *ops)
        if eq == "hqd,kd->hqk":
            shapes.append(tuple(out.shape))
        return out

    monkeypatch.setattr(torch, "einsum", recording)
    budget = 8 * 2 * N * 5  # two float32 [2 heads, 5 queries, N keys] tensors
    with torch.inference_mode(), capture(sdpa, EntropyConfig((N,), query_chunk=10**6, chunk_bytes=budget)) as cap:
        sdpa(ids)
    assert shapes and all(h == 2 and c <= 5 for h, c, _ in shapes)  # 4 query heads over 2 kv heads: 2 per group
    want = _eager_entropy(eager, ids)
    for layer in (0, 1):
        torch.testing.assert_close(cap.per_layer[layer], want[layer], atol=1e-5, rtol=1e-5)


# Issue 27, mutmut round 2 (positions, key_tokens, entropy, attention): behaviours the surviving mutants showed
# untested. Each test names the behaviour it pins; docs/testing.md lists the mutants each one kills.


def _reference_entropy(query, key, heads, scale, allowed=None, additive=None):
    """Per query: mean over `heads` of -sum p ln p, p = causal softmax(q k^T * scale) (float64, one head at a time)."""
    import torch

    n_heads, n = query.shape[1], query.shape[2]
    group = n_heads // key.shape[1]
    out = torch.zeros(n, dtype=torch.float64)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    for h in heads:
        z = query[0, h].double() @ key[0, h // group].double().T * scale
        if additive is not None:
            z = z + additive.double()
        ok = causal & (allowed if allowed is not None else True)
        p = torch.softmax(z.masked_fill(~ok, float("-inf")), -1)
        out += -(p * torch.where(p > 0, p.log(), torch.zeros_like(p))).sum(-1)
    return out / len(heads)


def _qk(n=9, heads=4, kv=2, dim=8, seed=0):
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, heads, n, dim, generator=g), torch.randn(1, kv, n, dim, generator=g)


def test_entropy_settings_are_checked():
    from ctxeval.evals.entropy import EntropyConfig

    for lengths in ((), (1,), (64, 1)):
        with pytest.raises(CtxevalError, match=r"^--lengths must be >= 2 tokens$"):
            EntropyConfig(lengths)
    with pytest.raises(CtxevalError, match=r"^--query-chunk must be >= 1, got 0$"):
        EntropyConfig((8,), query_chunk=0)
    cfg = EntropyConfig((2,), query_chunk=1)
    assert (cfg.layers, cfg.heads, cfg.chunk_bytes, cfg.bos) == (None, None, 2**31, True)
    assert EntropyConfig((8,)).query_chunk == 512


@pytest.mark.parametrize("heads, chunk", [(None, 4), ((1, 2), 3), ((3,), 100), ((0, 1, 2, 3), 1)])
def test_observe_equals_the_per_head_formula_with_grouped_keys(heads, chunk):
    from types import SimpleNamespace

    from ctxeval.evals.entropy import EntropyCapture

    q, k = _qk()
    cap = EntropyCapture(None, heads, chunk)
    cap.observe(SimpleNamespace(layer_idx=3), q, k, None, 0.5, {})
    want = _reference_entropy(q, k, heads or range(4), 0.5)
    assert list(cap.per_layer) == [3] and cap.per_layer[3].dtype == want.dtype
    assert torch_close(cap.per_layer[3], want)


def torch_close(a, b, tol=1e-5):
    return float((a.double() - b.double()).abs().max()) < tol


def test_observe_without_a_scaling_uses_one_over_the_root_of_the_head_dimension():
    from types import SimpleNamespace

    from ctxeval.evals.entropy import EntropyCapture

    q, k = _qk(dim=16)
    cap = EntropyCapture(None, None, 5)
    cap.observe(SimpleNamespace(layer_idx=0), q, k, None, None, {})
    assert torch_close(cap.per_layer[0], _reference_entropy(q, k, range(4), 0.25))
    assert not torch_close(cap.per_layer[0], _reference_entropy(q, k, range(4), 1.0))


@pytest.mark.parametrize("kind", ["bool4", "float4", "float3", "bool3", "bool4h", "float4h"])
def test_observe_applies_the_modules_mask(kind):
    """A sliding window of 3 keys as the module's mask (bool, or additive -inf), 4-D or without the batch axis, one
    for all heads or one per head of a key/value group (4h)."""
    from types import SimpleNamespace

    import torch

    from ctxeval.evals.entropy import EntropyCapture

    n = 9
    q, k = _qk(n=n)
    i = torch.arange(n)
    window = i[None, :] > i[:, None] - 3  # key j within 3 of query i (the causal part is the capture's own)
    mask = window if kind.startswith("bool") else torch.zeros(n, n).masked_fill(~window, float("-inf"))
    mask = (
        mask[None, None]
        if kind.endswith("4")
        else mask[None, None].expand(1, 2, n, n)
        if kind.endswith("4h")
        else mask[None]
    )
    cap = EntropyCapture(None, None, 4)
    cap.observe(SimpleNamespace(layer_idx=0), q, k, mask, 0.5, {})
    want = _reference_entropy(q, k, range(4), 0.5, allowed=window)
    assert torch_close(cap.per_layer[0], want)
    assert float(cap.per_layer[0][-1]) <= np.log(3) + 1e-6  # three keys at most


def test_observe_counts_layers_without_an_index_and_keeps_only_the_sampled_ones():
    from types import SimpleNamespace

    from ctxeval.evals.entropy import EntropyCapture

    q, k = _qk()
    cap = EntropyCapture({1, 2}, None, 4)
    for _ in range(4):
        cap.observe(SimpleNamespace(), q, k, None, 0.5, {})  # no layer_idx: the call's order
    assert sorted(cap.per_layer) == [1, 2] and cap.counter == 4
    cap.reset()
    assert cap.per_layer == {} and cap.counter == 0
    cap.observe(SimpleNamespace(layer_idx=None), q, k, None, 0.5, {})
    cap.observe(SimpleNamespace(layer_idx=2), q, k, None, 0.5, {})
    assert list(cap.per_layer) == [2] and cap.counter == 2


def test_observe_refuses_what_it_does_not_model():
    from types import SimpleNamespace

    import torch

    from ctxeval.evals.entropy import EntropyCapture

    q, k = _qk()
    cap = EntropyCapture(None, None, 4)
    for module, kwargs in (
        (SimpleNamespace(layer_idx=0), {"softcap": 50.0}),
        (SimpleNamespace(layer_idx=0, sinks=1), {}),
    ):
        with pytest.raises(
            CtxevalError,
            match=r"^entropy: this model's attention uses logit soft-capping or sinks, "
            r"which the entropy measurement does not model$",
        ):
            cap.observe(module, q, k, None, 0.5, kwargs)
    cap.observe(SimpleNamespace(layer_idx=0, sinks=None), q, k, None, 0.5, {"softcap": None})  # absent: fine
    one = r"^entropy measures one full-sequence forward at a time \(batch 1, no cache\)$"
    with pytest.raises(CtxevalError, match=one):
        cap.observe(SimpleNamespace(layer_idx=0), torch.cat((q, q)), torch.cat((k, k)), None, 0.5, {})
    with pytest.raises(CtxevalError, match=one):
        cap.observe(SimpleNamespace(layer_idx=0), q[:, :, -1:], k, None, 0.5, {})
    with pytest.raises(CtxevalError, match=r"^--heads 4 is out of range: the model has 4 query heads$"):
        EntropyCapture(None, (0, 4), 4).observe(SimpleNamespace(layer_idx=0), q, k, None, 0.5, {})


def _runner(bos=True, bos_id=1, progress=None, heads=None):
    from helpers import tiny_llama

    from ctxeval.evals.entropy import EntropyConfig, EntropyRunner

    model = tiny_llama(num_hidden_layers=2, attn_implementation="sdpa")
    cfg = EntropyConfig((8, 16), heads=heads, bos=bos)
    return EntropyRunner(model, "cpu", cfg, bos_id, "tiny", progress), cfg


def test_the_entropy_sequence_is_bos_and_the_documents_first_tokens():
    from ctxeval.data.corpora import TokenDoc

    doc = TokenDoc("d", np.arange(10, 40))
    with_bos, _ = _runner()
    assert with_bos._ids(doc, 8).tolist() == [[1, 10, 11, 12, 13, 14, 15, 16]]
    assert _runner(bos_id=0)[0]._ids(doc, 4).tolist() == [[0, 10, 11, 12]]  # BOS id 0 is a BOS
    assert _runner(bos_id=None)[0]._ids(doc, 4).tolist() == [[10, 11, 12, 13]]
    assert _runner(bos=False)[0]._ids(doc, 4).tolist() == [[10, 11, 12, 13]]


def test_an_entropy_row_holds_the_per_layer_means_over_its_length():
    import torch

    from ctxeval.data.corpora import TokenDoc
    from ctxeval.runs.rows import uniform_entropy
    from ctxeval.specs import expand_specs

    runner, _ = _runner(heads=(0, 3))
    per_layer = {1: torch.arange(16, dtype=torch.float64), 0: torch.ones(16, dtype=torch.float64)}
    spec = expand_specs(["yarn:factor=2"])[0]
    row = runner._row(spec, TokenDoc("d", np.arange(20)), 8, per_layer, 1.25)
    assert {
        k: row[k]
        for k in (
            "model",
            "label",
            "task",
            "metric",
            "length",
            "doc",
            "layers",
            "entropy_per_layer",
            "entropy",
            "value",
            "uniform_entropy",
            "heads",
            "seconds",
            "status",
        )
    } == {
        "model": "tiny",
        "label": "yarn(factor=2)",
        "task": "entropy",
        "metric": row["metric"],
        "length": 8,
        "doc": "d",
        "layers": [0, 1],
        "entropy_per_layer": [1.0, 3.5],
        "entropy": 2.25,
        "value": 2.25,
        "uniform_entropy": uniform_entropy(8),
        "heads": [0, 3],
        "seconds": 1.25,
        "status": "ok",
    }
    assert _runner()[0]._row(spec, TokenDoc("d", np.arange(20)), 8, per_layer, 1.0)["heads"] == "all"


class _Notes:
    def __init__(self):
        self.events = []

    def note(self, text):
        self.events.append(("note", text))

    def advance(self, amount, text):
        self.events.append(("advance", amount, text))

    def start(self, total):
        self.events.append(("start", total))


def _out_of_memory_at(runner, failing: int) -> list[int]:
    """Make the runner's forward run out of memory at one length; returns the lengths it is called with."""
    from ctxeval.evals.common import PointOOM

    calls, real = [], runner._forward

    def forward(cap, doc, length):
        calls.append(length)
        if length == failing:
            raise PointOOM("out of memory (injected)")
        return real(cap, doc, length)

    runner._forward = forward
    return calls


def test_a_length_dependent_method_runs_one_forward_per_length_and_an_oom_ends_in_a_row():
    from ctxeval.data.corpora import TokenDoc
    from ctxeval.evals.entropy import capture
    from ctxeval.specs import expand_specs

    notes = _Notes()
    runner, cfg = _runner(progress=notes)
    calls = _out_of_memory_at(runner, 16)
    rows, spec = [], expand_specs(["dynamic-ntk"])[0]
    with capture(runner.model, cfg) as cap:
        runner.measure(spec, TokenDoc("d", np.arange(5, 45)), [24, 16, 8], cap, rows.extend, static=False)
    assert calls == [8, 16, 24]  # the length after the one that ran out of memory is still measured
    assert [(r["length"], r["status"]) for r in rows] == [(8, "ok"), (16, "oom"), (24, "ok")]
    assert {k: rows[1][k] for k in ("model", "label", "task", "doc", "note", "value")} == {
        "model": "tiny",
        "label": "dynamic-ntk",
        "task": "entropy",
        "doc": "d",
        "note": "out of memory (injected)",
        "value": None,
    }
    assert notes.events == [
        ("advance", 8, "dynamic-ntk d L=8"),
        ("note", "dynamic-ntk: out of memory at 16 tokens"),
        ("advance", 24, "dynamic-ntk d L=24"),
    ]


def test_a_static_method_that_runs_out_of_memory_says_so_and_measures_length_by_length():
    from ctxeval.data.corpora import TokenDoc
    from ctxeval.evals.entropy import capture
    from ctxeval.specs import expand_specs

    notes = _Notes()
    runner, cfg = _runner(progress=notes)
    calls = _out_of_memory_at(runner, 16)
    rows = []
    with capture(runner.model, cfg) as cap:
        runner.measure(expand_specs(["none"])[0], TokenDoc("d", np.arange(5, 45)), [16, 8], cap, rows.extend)
    assert calls == [16, 8, 16]
    assert [(r["length"], r["status"]) for r in rows] == [(8, "ok"), (16, "oom")]
    assert notes.events == [
        ("note", "none: out of memory at 16 tokens; measuring length by length"),
        ("advance", 8, "none d L=8"),
        ("note", "none: out of memory at 16 tokens"),
    ]


def test_a_static_method_measures_every_length_in_one_forward():
    from ctxeval.data.corpora import TokenDoc
    from ctxeval.evals.entropy import capture
    from ctxeval.specs import expand_specs

    notes = _Notes()
    runner, cfg = _runner(progress=notes)
    calls, real = [], runner._forward
    runner._forward = lambda cap, doc, length: calls.append(length) or real(cap, doc, length)
    rows = []
    with capture(runner.model, cfg) as cap:
        runner.measure(expand_specs(["none"])[0], TokenDoc("d", np.arange(5, 45)), [16, 8], cap, rows.extend)
    assert calls == [16] and [r["length"] for r in rows] == [8, 16]
    assert 0 < rows[0]["seconds"] == rows[1]["seconds"] < 60
    assert notes.events == [("advance", 16, "none d L=16")]


def test_layers_are_checked_against_the_models():
    from ctxeval.evals.entropy import check_layers

    check_layers(2, None)
    check_layers(2, (0, 1))
    for layers in ((2,), (-1,), (0, 2)):
        with pytest.raises(CtxevalError, match=rf"^--layers must be in 0\.\.1, got {','.join(map(str, layers))}$"):
            check_layers(2, layers)


def test_a_model_whose_attention_is_not_seen_is_refused():
    from ctxeval.data.corpora import TokenDoc
    from ctxeval.evals.entropy import EntropyCapture

    runner, _ = _runner()
    with pytest.raises(
        CtxevalError,
        match=r"^entropy: no attention call was seen; this model does not use "
        r"transformers' attention functions \(sdpa\)$",
    ):
        runner._forward(EntropyCapture(None, None, 8), TokenDoc("d", np.arange(5, 45)), 8)  # not watching sdpa


def test_the_entropy_sweep_measures_what_the_runner_measures_with_bos_per_method(tmp_path):
    """Each method's rows equal EntropyRunner's under that method (BOS first, as the tokenizer gives it); a
    length-dependent method gets one forward per length, a static one one forward at the longest length."""
    from ctxeval.data.corpora import TokenDoc
    from ctxeval.evals.entropy import EntropyConfig, EntropyRunner, capture, sweep
    from ctxeval.evals.sweep import applying
    from ctxeval.models.load import load_model
    from ctxeval.runs.store import RunStore
    from ctxeval.specs import expand_specs
    from ctxeval.tiny import MODEL_DIR

    lm = load_model(str(MODEL_DIR), device="cpu", dtype="float32")
    assert lm.tokenizer.bos_token_id is not None
    specs = expand_specs(["none", "dynamic-ntk"])
    doc = TokenDoc("d", np.arange(5, 305) % 100 + 3)
    cfg = EntropyConfig((64, 256), layers=(1,))  # the tiny model is trained on 128: dynamic NTK scales past it
    store = RunStore(tmp_path / "run", {"t": 1})
    store.start({})
    notes = _Notes()
    sweep(lm, specs, [doc], cfg, store, notes)
    got = {(r["label"], r["length"]): r["entropy"] for r in store.rows()}
    runner = EntropyRunner(lm.model, "cpu", cfg, lm.tokenizer.bos_token_id, lm.name)
    want = {}
    with capture(lm.model, cfg) as cap:
        for spec, static in ((specs[0], True), (specs[1], False)):
            rows = []
            with applying(lm, spec, cfg.lengths):
                runner.measure(spec, doc, [64, 256], cap, rows.extend, static=static)
            want.update({(r["label"], r["length"]): r["entropy"] for r in rows})
    assert got == pytest.approx(want, abs=1e-9)
    assert got[("dynamic-ntk", 64)] == got[("none", 64)] != got[("dynamic-ntk", 256)]  # NTK only past 128
    assert got[("dynamic-ntk", 256)] != pytest.approx(got[("none", 256)], abs=1e-6)
    assert notes.events[0] == ("start", 256 + 64 + 256)  # the static method's longest length, the dynamic one's sum
    assert [e for e in notes.events if e[0] == "advance"] == [
        ("advance", 256, "none d L=256"),
        ("advance", 64, "dynamic-ntk d L=64"),
        ("advance", 256, "dynamic-ntk d L=256"),
    ]


def test_the_query_chunk_is_the_largest_the_byte_budget_allows(monkeypatch):
    """Two float32 [2 heads, chunk, 9 keys] tensors per chunk: a budget of 8 * 2 * 9 * 3 bytes gives chunks of 3
    queries, a budget below one query's gives chunks of 1."""
    from types import SimpleNamespace

    import torch

    from ctxeval.evals.entropy import EntropyCapture

    q, k = _qk(n=9)
    real, chunks = torch.einsum, []

    def recording(eq, *ops):
        out = real(eq, *ops)
        chunks.append(out.shape[1])
        return out

    monkeypatch.setattr(torch, "einsum", recording)
    for budget, want in ((8 * 2 * 9 * 3, [3, 3, 3]), (8 * 2 * 9 * 3 - 1, [2, 2, 2, 2, 1]), (1, [1] * 9)):
        chunks.clear()
        cap = EntropyCapture(None, None, 100, chunk_bytes=budget)
        cap.observe(SimpleNamespace(layer_idx=0), q, k, None, 0.5, {})
        assert chunks == want * 2, budget  # two key/value heads
        assert torch_close(cap.per_layer[0], _reference_entropy(q, k, range(4), 0.5))


def test_native_with_a_shipped_dynamic_rope_is_measured_length_by_length(tmp_path):
    import dataclasses

    from ctxeval.data.corpora import TokenDoc
    from ctxeval.evals.entropy import EntropyConfig, sweep
    from ctxeval.models.load import load_model
    from ctxeval.runs.store import RunStore
    from ctxeval.specs import expand_specs
    from ctxeval.tiny import MODEL_DIR

    lm = load_model(str(MODEL_DIR), device="cpu", dtype="float32")
    lm.rope = dataclasses.replace(lm.rope, shipped={**lm.rope.shipped, "rope_type": "dynamic"})
    store = RunStore(tmp_path / "run", {"t": 1})
    store.start({})
    notes = _Notes()
    sweep(
        lm,
        expand_specs(["native"]),
        [TokenDoc("d", np.arange(5, 45))],
        EntropyConfig((16, 32), layers=(0,)),
        store,
        notes,
    )
    assert notes.events[0] == ("start", 16 + 32)
    assert [e for e in notes.events if e[0] == "advance"] == [
        ("advance", 16, "native d L=16"),
        ("advance", 32, "native d L=32"),
    ]
