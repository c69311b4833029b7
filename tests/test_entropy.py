"""Attention entropy: the chunked sdpa capture equals entropies from eager attention maps, leaves the model's output
unchanged, one forward serves every shorter length, and the CLI writes a resumable run with table and plot."""

import json

import numpy as np
import pytest
import torch
from conftest import tiny_llama
from typer.testing import CliRunner

from ctxeval.attention.patching import attention_temperature
from ctxeval.cli import app
from ctxeval.data.corpora import TokenDoc
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
