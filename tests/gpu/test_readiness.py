"""What a GPU user would hit first, each checked on the CPU: an LM head on another device than the targets, a model
cast to bf16 after loading, generation stopping on every stop id, and a non-finite loss."""

import json
import math

import numpy as np
import pytest
import torch
from evals.fake_lm import FakeLM, docs
from helpers import TINY, tiny_llama

from ctxeval.evals import perplexity as P
from ctxeval.models.generation import greedy_config, stop_ids
from ctxeval.rope.patching import apply_method
from ctxeval.runs.store import RunStore
from ctxeval.specs import expand_specs

L = TINY["max_position_embeddings"]


def test_loss_inputs_share_a_device_when_the_head_sits_elsewhere(monkeypatch):
    """--device-map may put lm_head on another GPU than the embeddings (and the targets): the loss must be computed
    where the logits are. Here the head's output lands on the meta device."""
    model = tiny_llama(tie_word_embeddings=False)
    head = model.get_output_embeddings()
    original = head.forward
    head.forward = lambda x: original(x).to("meta")
    seen = []

    def recording_cross_entropy(logits, targets, **kw):
        seen.append((logits.device, targets.device))
        return torch.zeros(targets.shape, device=logits.device)

    monkeypatch.setattr(P.F, "cross_entropy", recording_cross_entropy)
    with pytest.raises(NotImplementedError):  # copying a meta tensor back to the CPU: past the loss, as intended
        P.token_nll(model, torch.arange(2, 40).unsqueeze(0), chunk_size=16)
    assert seen and all(a == b for a, b in seen)


def test_a_bf16_inv_freq_is_upcast_while_applied_and_restored_exactly():
    model = tiny_llama().to(torch.bfloat16)
    rotary = model.model.rotary_emb
    before = rotary.inv_freq.clone()
    assert before.dtype == torch.bfloat16
    with apply_method(model, "yarn", factor=4) as handle:  # would fail the read-back with bf16 frequencies
        assert rotary.inv_freq.dtype == torch.float32
        assert handle.verify() < 1e-5
        with torch.no_grad():
            out = model(torch.arange(2, 20).unsqueeze(0)).logits
        assert torch.isfinite(out).all()
    assert rotary.inv_freq.dtype == torch.bfloat16 and torch.equal(rotary.inv_freq, before)


def test_generation_stops_on_every_stop_id():
    tok = type("Tok", (), {"eos_token_id": 2, "pad_token_id": None})()
    model = type("M", (), {"generation_config": type("G", (), {"eos_token_id": [2, 7, 9]})()})()
    assert stop_ids(tok, model) == [2, 7, 9]
    cfg = greedy_config(tok, 5, model)
    assert cfg.eos_token_id == [2, 7, 9] and cfg.pad_token_id == 2
    single = type("M", (), {"generation_config": type("G", (), {"eos_token_id": 5})()})()
    assert stop_ids(tok, single) == [2, 5] and stop_ids(tok) == [2]


def test_generation_really_stops_at_a_shipped_stop_id():
    """A tiny model whose greedy continuation is known: stopping on a second stop id ends the reply there."""
    model = tiny_llama()
    prompt = torch.arange(2, 12).unsqueeze(0)
    tok = type("Tok", (), {"eos_token_id": 0, "pad_token_id": 0})()
    free = model.generate(prompt, attention_mask=torch.ones_like(prompt), generation_config=greedy_config(tok, 6))
    first = int(free[0, prompt.shape[1]])
    assert first != 0
    model.generation_config.eos_token_id = [0, first]
    stopped = model.generate(
        prompt, attention_mask=torch.ones_like(prompt), generation_config=greedy_config(tok, 6, model)
    )
    assert stopped.shape[1] == prompt.shape[1] + 1  # the stop token itself, then nothing


def test_a_non_finite_loss_is_an_error_row_not_ok(tmp_path, monkeypatch):
    model = tiny_llama()
    real = P.token_nll

    def overflowing(model_, ids, chunk):
        nll = real(model_, ids, chunk).clone()
        if ids.shape[1] > 100:
            nll[100] = float("inf")  # position 101 overflows
        return nll

    monkeypatch.setattr(P, "token_nll", overflowing)
    store = RunStore(tmp_path / "r", {"t": 1})
    store.start({})
    lengths = (L, 96, 2 * L)  # 64 and 96 end before position 101 (positions 1..L-1 are scored); 128 does not
    P.sweep(FakeLM(model), expand_specs(["none", "dynamic-ntk"]), docs(1), P.PplConfig(lengths), store)
    rows = {(r["label"], r["length"]): r for r in store.rows()}
    for label in ("none", "dynamic-ntk"):  # one forward for all lengths / one forward per length
        assert rows[(label, L)]["status"] == "ok" and math.isfinite(rows[(label, L)]["ppl"])
        assert rows[(label, 96)]["status"] == "ok"
        bad = rows[(label, 2 * L)]
        assert bad["status"] == "error" and bad["value"] is None and "non-finite NLL" in bad["note"]
        assert "position 101" in bad["note"]
    from ctxeval.report.tables import ppl_long

    long = ppl_long(store.rows()).set_index(["label", "length"])
    assert math.isnan(long.loc[("none", 2 * L), "ppl"]) and long.loc[("none", 2 * L), "status"] == "error"


def test_ppl_on_local_files_runs_without_datasets_rdata_or_gguf(tmp_path, tiny_model_dir, text_dir):
    """A GPU image without datasets, rdata or gguf (the H200 image we can use has none of them) still runs the CLI
    and `ctxeval ppl` on local text files: those packages are imported only where they are used."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "for name in ('datasets', 'rdata', 'gguf'):\n"
        "    sys.modules[name] = None  # import name -> ImportError\n"
        "from ctxeval.cli import main\n"
        f"sys.argv = ['ctxeval', 'ppl', '--model', {str(tiny_model_dir)!r}, '--data', {str(text_dir)!r}, "
        f"'--lengths', '32,64', '-m', 'none', '-m', 'yarn:factor=2', '--out', {str(tmp_path / 'r')!r}]\n"
        "main()\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "r" / "rows.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(r["status"] == "ok" for r in rows)


def test_rows_record_throughput_and_run_json_the_gpu(tmp_path):
    from ctxeval.runs.store import environment

    model = tiny_llama()
    store = RunStore(tmp_path / "r", {"t": 1})
    store.start({})
    P.sweep(FakeLM(model), expand_specs(["none", "dynamic-ntk"]), docs(1), P.PplConfig((L, 2 * L)), store)
    rows = store.rows()
    assert all(r["tokens_per_s"] > 0 and r["peak_gib"] is None for r in rows)  # peak memory: CUDA only
    one = [r for r in rows if r["label"] == "none"]
    assert one[0]["tokens_per_s"] == one[1]["tokens_per_s"]  # one forward served both lengths
    gpu = environment()["gpu"]
    assert gpu is None or {"name", "memory_gib", "count"} <= set(gpu)


@pytest.mark.parametrize("bos", [True, False])
def test_batched_sliding_windows_equal_one_window_per_forward(bos):
    model = tiny_llama()
    doc = docs(1, 5 * L + 23)[0]  # full windows, then ragged ones at the end
    spec = expand_specs(["none"])[0]
    edges = (1, 16, 48, L)
    rows = {}
    for batch in (1, 3, 8):
        cfg = P.PplConfig((L,), "sliding", stride=L // 4, bos=bos, position_edges=edges, batch_size=batch)
        runner_ = P.PplRunner(model, "cpu", cfg, 1, "tiny")
        seqs = []
        real = runner_._nll_batch
        runner_._nll_batch = lambda s, finite=True, seqs=seqs, real=real: (seqs.append(len(s)), real(s, finite))[1]
        rows[batch] = runner_._sliding_at(spec, doc, L)
        assert max(seqs) == min(batch, max(seqs)) and (batch == 1 or max(seqs) > 1)
    for batch in (3, 8):
        for field in ("n_tokens", "n_windows", "position_tokens"):
            assert rows[batch][field] == rows[1][field]
        assert rows[batch]["nll_sum"] == pytest.approx(rows[1]["nll_sum"], rel=1e-6)
        assert rows[batch]["window_nll_sum"] == pytest.approx(rows[1]["window_nll_sum"], rel=1e-6)
        np.testing.assert_allclose(rows[batch]["position_nll_sum"], rows[1]["position_nll_sum"], rtol=1e-6)


def test_out_of_memory_halves_the_window_batch_before_giving_up():
    model = tiny_llama()
    doc = docs(1, 4 * L)[0]
    cfg = P.PplConfig((L,), "sliding", stride=L // 4, batch_size=8)
    runner_ = P.PplRunner(model, "cpu", cfg, 1, "tiny")
    sizes = []
    real = runner_._nll_batch

    def limited(seqs, finite=True):
        sizes.append(len(seqs))
        if len(seqs) > 2:
            raise P.PointOOM("out of memory")
        return real(seqs, finite)

    runner_._nll_batch = limited
    row = runner_._sliding_at(expand_specs(["none"])[0], doc, L)
    assert sizes[:3] == [8, 4, 2] and max(sizes[3:]) <= 2
    unbatched = P.PplRunner(model, "cpu", P.PplConfig((L,), "sliding", stride=L // 4), 1, "tiny")
    assert row["nll_sum"] == pytest.approx(
        unbatched._sliding_at(expand_specs(["none"])[0], doc, L)["nll_sum"], rel=1e-6
    )


def test_sliding_window_models_are_warned_about_and_their_mask_counted(tmp_path, text_dir):
    from helpers import build_tokenizer
    from transformers import MistralConfig, MistralForCausalLM
    from typer.testing import CliRunner

    from ctxeval.cli import app
    from ctxeval.models.memory import estimate, sliding_window_of

    tok = build_tokenizer()
    cfg = MistralConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        sliding_window=32,
    )
    torch.manual_seed(0)
    path = tmp_path / "mistral"
    MistralForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    assert sliding_window_of(cfg) == 32
    plain = estimate(MistralConfig(**{**cfg.to_dict(), "sliding_window": None}), (131072,), "bfloat16", "sdpa", 1024)
    windowed = estimate(cfg, (131072,), "bfloat16", "sdpa", 1024)
    assert windowed[0].attention - plain[0].attention == 131072**2  # 16 GiB of mask at 128k
    assert estimate(cfg, (131072,), "bfloat16", "flash_attention_2", 1024)[0].attention == 0
    result = CliRunner().invoke(
        app, ["ppl", "--model", str(path), "--data", str(text_dir), "--lengths", "32,64", "--out", str(tmp_path / "r")]
    )
    assert result.exit_code == 0, result.output
    assert "sliding window" in result.stderr and "--attn flash_attention_2" in result.stderr


def test_forced_needle_carries_the_batch_that_fitted_to_longer_lengths():
    """Out of memory at 4 prompts per forward at one length: the longer lengths start at the halved batch instead
    of failing at the full batch again (each failed attempt at 70 GB costs a forward)."""
    from helpers import build_tokenizer

    from ctxeval.data.presets import load_task
    from ctxeval.evals import haystack as H
    from ctxeval.evals import needle as N

    tok = build_tokenizer()
    model = tiny_llama(vocab_size=len(tok))
    hay, _ = H.haystack_tokens(tok, "filler", 4000)
    builder = H.PromptBuilder(
        tok, H.NeedlePreset.from_dict("passkey", load_task("needle-passkey", "needle")), hay, chat_template=False
    )
    cfg = N.NeedleConfig((256, 288, 320), (0.0, 50.0, 100.0), samples=2, scoring="forced", batch_size=4)
    runner_ = N.NeedleRunner(model, tok, "cpu", builder, cfg, "tiny", "needle")
    attempts = []
    real = runner_._forced

    def limited(chunk):
        attempts.append((chunk[0].length, len(chunk)))
        if len(chunk) > 2:
            raise N.PointOOM("out of memory (injected)")
        return real(chunk)

    runner_._forced = limited
    rows = []
    runner_.measure(
        expand_specs(["none"])[0], [(L, d, s) for L in (256, 288, 320) for d in range(3) for s in range(2)], rows.extend
    )
    assert len(rows) == 18 and all(r["status"] == "ok" for r in rows)
    assert attempts[0] == (256, 4) and attempts[1] == (256, 2)
    assert all(size <= 2 for length, size in attempts if length > 256)  # no full-batch retry at 288 and 320


def test_device_map_offload_to_cpu_is_warned_about(monkeypatch, capsys):
    import ctxeval.cli.run as run

    model = tiny_llama()
    model.hf_device_map = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": "cpu", "lm_head": "disk"}

    class Loaded:
        def __init__(self):
            from ctxeval.rope.geometry import rope_info_from_config

            self.model, self.name, self.device, self.attn_implementation = model, "m", "cpu", "sdpa"
            self.rope = rope_info_from_config(model.config)

    monkeypatch.setattr(run, "load_model", lambda *a, **k: Loaded())
    lines = []
    monkeypatch.setattr(run.err, "print", lambda text, *a, **k: lines.append(text))
    run.load_for("m", expand_specs(["none"]), "auto", "auto", "sdpa", False, device_map="auto")
    assert any("cpu and disk" in line for line in lines)


def test_allocation_failures_of_cublas_and_cudnn_count_as_out_of_memory():
    from ctxeval.evals.common import PointOOM, is_oom, oom_guard

    assert is_oom(RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"))
    assert is_oom(RuntimeError("cuDNN error: CUDNN_STATUS_NOT_ENOUGH_WORKSPACE"))
    assert not is_oom(RuntimeError("CUDA error: an illegal memory access was encountered"))
    with pytest.raises(PointOOM, match="CUBLAS_STATUS_ALLOC_FAILED") as caught:
        with oom_guard("cpu"):
            raise RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`")
    # the original error keeps no traceback (its frames would pin the failed forward's tensors), nor is it shown
    assert caught.value.__context__.__traceback__ is None and caught.value.__suppress_context__
    with pytest.raises(ValueError):
        with oom_guard("cpu"):
            raise ValueError("not memory")


def test_the_cli_asks_for_expandable_cuda_segments(monkeypatch):
    import os

    import ctxeval.cli as cli

    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.setattr(cli, "app", lambda: None)
    cli.main()
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")
    cli.main()
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128"


@pytest.mark.parametrize("method", ["none", "yarn:factor=4", "dynamic-ntk:factor=2"])
def test_documents_batched_under_truncate_equal_one_document_at_a_time(tmp_path, method, monkeypatch):
    model = tiny_llama()
    lengths = (L // 2, L, 2 * L)
    documents = docs(5, 3 * L)
    specs = expand_specs([method])
    got, widths = {}, []
    real = P.batch_token_nll
    monkeypatch.setattr(P, "batch_token_nll", lambda m, ids, c: (widths.append(ids.shape[0]), real(m, ids, c))[1])
    for batch in (1, 2, 4):
        widths.clear()
        store = RunStore(tmp_path / f"b{batch}", {"t": 1})
        store.start({})
        P.sweep(
            FakeLM(model),
            specs,
            documents,
            P.PplConfig(lengths, position_edges=(1, 32, 64, 128), batch_size=batch),
            store,
        )
        got[batch] = {(r["doc"], r["length"]): r for r in store.rows()}
        assert max(widths) == batch  # documents really shared forwards (and none did with batch 1)
    assert len(got[1]) == 15
    for batch in (2, 4):
        assert got[batch].keys() == got[1].keys()
        for key, want in got[1].items():
            row = got[batch][key]
            assert row["status"] == "ok" and row["n_tokens"] == want["n_tokens"]
            assert row["nll_sum"] == pytest.approx(want["nll_sum"], rel=1e-6)
            np.testing.assert_allclose(row["position_nll_sum"], want["position_nll_sum"], rtol=1e-6)


def test_a_document_batch_that_runs_out_of_memory_is_halved(tmp_path, monkeypatch):
    model = tiny_llama()
    runner_ = P.PplRunner(model, "cpu", P.PplConfig((L, 2 * L), batch_size=4), 1, "tiny")
    sizes = []
    real = runner_._nll_batch

    def limited(seqs, finite=True):
        sizes.append(len(seqs))
        if len(seqs) > 1:
            raise P.PointOOM("out of memory (injected)")
        return real(seqs, finite)

    runner_._nll_batch = limited
    rows = []
    runner_.measure_docs(expand_specs(["none"])[0], docs(4, 3 * L), [L, 2 * L], rows.extend)
    assert sizes[:3] == [4, 2, 1] and len(rows) == 8 and all(r["status"] == "ok" for r in rows)


def test_generated_needle_answers_batched_equal_one_prompt_at_a_time():
    from helpers import build_tokenizer

    from ctxeval.data.presets import load_task
    from ctxeval.evals import haystack as H
    from ctxeval.evals import needle as N

    tok = build_tokenizer()
    model = tiny_llama(vocab_size=len(tok))
    hay, _ = H.haystack_tokens(tok, "filler", 4000)
    builder = H.PromptBuilder(
        tok, H.NeedlePreset.from_dict("passkey", load_task("needle-passkey", "needle")), hay, chat_template=False
    )
    cells = [(256, d, s) for d in range(3) for s in range(3)]
    rows, calls = {}, []
    for batch in (1, 4):
        runner_ = N.NeedleRunner(
            model,
            tok,
            "cpu",
            builder,
            N.NeedleConfig((256,), (0.0, 50.0, 100.0), samples=3, batch_size=batch),
            "tiny",
            "needle",
        )
        real = runner_._generate_batch
        runner_._generate_batch = lambda items, handle, real=real: (calls.append(len(items)), real(items, handle))[1]
        got = []
        runner_.measure(expand_specs(["none"])[0], cells, got.extend)
        rows[batch] = {(r["depth"], r["sample"]): (r["response"], r["correct"]) for r in got}
    assert rows[4] == rows[1] and len(rows[1]) == 9
    assert max(calls) > 1  # prompts really shared generate calls
