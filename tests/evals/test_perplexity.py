"""ctxeval ppl: protocols, chunked loss, resume, interruption, OOM, bad input, end to end through the CLI."""

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from evals.fake_lm import FakeLM, docs
from helpers import TINY, tiny_llama
from typer.testing import CliRunner

from ctxeval.cli import app
from ctxeval.data.corpora import TokenDoc
from ctxeval.evals import perplexity as P
from ctxeval.report import tables
from ctxeval.rope.patching import apply_method
from ctxeval.runs.store import RunStore
from ctxeval.specs import expand_specs

runner = CliRunner()


L = TINY["max_position_embeddings"]


def full_nll(model, seq):
    ids = torch.tensor([seq])
    with torch.no_grad():
        logits = model(ids).logits[0, :-1].float()
    return F.cross_entropy(logits, ids[0, 1:], reduction="none")


# ------------------------------------------------------------------------------------------------- chunked loss
@pytest.mark.parametrize("tied", [True, False])
def test_chunked_loss_equals_full_logits(tied):
    model = tiny_llama(tie_word_embeddings=tied)
    seq = [2 + i % 120 for i in range(3 * L)]
    want = full_nll(model, seq)
    for chunk in (1, 7, 64, 10_000):
        torch.testing.assert_close(P.token_nll(model, torch.tensor([seq]), chunk), want, rtol=1e-5, atol=1e-5)
    assert P.check_chunked_head(model, "cpu", TINY["vocab_size"]) < 1e-5


def test_chunked_loss_with_logit_softcapping():
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    cfg = Gemma2Config(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        final_logit_softcapping=5.0,
        max_position_embeddings=64,
    )
    model = Gemma2ForCausalLM(cfg).eval()
    seq = list(range(2, 100))
    torch.testing.assert_close(P.token_nll(model, torch.tensor([seq]), 16), full_nll(model, seq), rtol=1e-5, atol=1e-5)


def test_custom_logit_postprocessing_is_refused(llama):
    llama.get_output_embeddings()
    original = llama.forward

    def shifted(*a, **k):
        out = original(*a, **k)
        out.logits = out.logits + 3.0 * torch.arange(out.logits.shape[-1])
        return out

    llama.forward = shifted
    with pytest.raises(Exception, match="post-processes logits"):
        P.check_chunked_head(llama, "cpu", TINY["vocab_size"])


# ------------------------------------------------------------------------------------------------- protocols
def _store(tmp_path, name="run"):
    store = RunStore(tmp_path / name, {"t": 1})
    store.start({})
    return store


@pytest.mark.parametrize("method", ["none", "yarn:factor=4", "dynamic-ntk:factor=2", "dynamic-yarn"])
def test_one_forward_equals_per_length_forwards(tmp_path, method):
    model = tiny_llama()
    lengths = (L // 2, L, 2 * L, 4 * L)
    cfg = P.PplConfig(lengths)
    store = _store(tmp_path)
    specs = expand_specs([method])
    documents = docs()
    P.sweep(FakeLM(model), specs, documents, cfg, store)
    rows = {(r["doc"], r["length"]): r for r in store.rows()}
    spec = specs[0]
    with apply_method(model, spec.name, **spec.params):
        for doc in documents:
            for length in lengths:
                want = full_nll(model, [1] + doc.ids[: length - 1].tolist()).double()
                got = rows[(doc.doc_id, length)]
                assert got["n_tokens"] == length - 1
                assert abs(got["nll_sum"] - float(want.sum())) / float(want.sum()) <= 1e-4


def test_sliding_scores_every_token_once(tmp_path):
    model = tiny_llama()
    doc = docs(1, 3 * L + 17)[0]
    for bos in (True, False):
        cfg = P.PplConfig((L,), "sliding", stride=L // 4, bos=bos)
        runner_ = P.PplRunner(model, "cpu", cfg, 1, "tiny")
        row = runner_._sliding_at(expand_specs(["none"])[0], doc, L)
        assert row["n_tokens"] == len(doc.ids) - (0 if bos else 1)
        # reference: score token t with the window that first covers it, computed naively
        content = L - 1 if bos else L
        want, scored = 0.0, (0 if bos else 1)
        for begin in range(0, len(doc.ids), L // 4):
            end = min(begin + content, len(doc.ids))
            seq = ([1] if bos else []) + doc.ids[begin:end].tolist()
            nll = full_nll(model, seq).double()
            first = begin if bos else begin + 1
            want += float(nll[scored - first :].sum())
            scored = end
            if end == len(doc.ids):
                break
        assert row["nll_sum"] == pytest.approx(want, rel=1e-5)


def test_config_validation():
    from ctxeval.errors import CtxevalError

    with pytest.raises(CtxevalError, match="stride"):
        P.PplConfig((64,), "sliding", stride=0)
    with pytest.raises(CtxevalError, match="skipped"):
        P.PplConfig((64,), "sliding", stride=64)
    with pytest.raises(CtxevalError, match="protocol"):
        P.PplConfig((64,), "nope")


def test_oom_is_recorded_and_longer_lengths_skipped(tmp_path, monkeypatch):
    model = tiny_llama()
    real = P.token_nll

    def limited(model_, ids, chunk):
        if ids.shape[1] > 2 * L:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(model_, ids, chunk)

    monkeypatch.setattr(P, "token_nll", limited)
    store = _store(tmp_path)
    P.sweep(
        FakeLM(model),
        expand_specs(["none", "dynamic-ntk:factor=2"]),
        docs(1),
        P.PplConfig((L, 2 * L, 4 * L, 8 * L)),
        store,
    )
    status = {(r["label"], r["length"]): r["status"] for r in store.rows()}
    for label in ("none", "dynamic-ntk(factor=2)"):
        assert status[(label, L)] == status[(label, 2 * L)] == "ok"
        assert status[(label, 4 * L)] == "oom" and status[(label, 8 * L)] == "skipped"
    for row in store.rows():  # the row contract: metric and value on every row, None where nothing was measured
        assert row["metric"] == "nll"
        assert row["value"] == (row["nll_sum"] / row["n_tokens"] if row["status"] == "ok" else None)


# ------------------------------------------------------------------------------------------------- CLI end to end
def ppl(*args):
    return runner.invoke(app, ["ppl", *args])


def test_cli_end_to_end_resume_and_outputs(tmp_path, tiny_model_dir, text_dir):
    out = tmp_path / "run"
    args = [
        "--model",
        str(tiny_model_dir),
        "--data",
        str(text_dir),
        "--lengths",
        "32,64,128",
        "--method",
        "none",
        "--method",
        "yarn",
        "--factor",
        "2,4",
        "--out",
        str(out),
    ]
    first = ppl(*args)
    assert first.exit_code == 0, first.output
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "success"
    assert run["data"]["documents"][0]["doc"].endswith("a_long.txt")
    assert set(run["methods"]) == {"none", "yarn(factor=2)", "yarn(factor=4)"}
    eff = run["methods"]["yarn(factor=4)"]["effective"][0]
    assert eff["attention_factor"] == pytest.approx(0.1 * math.log(4) + 1)
    assert eff["max_rel_diff"] < 1e-5
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert len(rows) == 9 and all(r["status"] == "ok" for r in rows)
    assert {"model", "method", "params", "task", "length", "metric", "value", "n_tokens", "seconds", "ppl"} <= set(
        rows[0]
    )
    for name in ("table.md", "table.csv", "valid.csv", "ppl.png"):
        assert (out / name).stat().st_size > 0
    table = (out / "table.md").read_text()
    assert "yarn(factor=4)" in table and "Valid length" in table
    # rerun: nothing re-measured, same table
    second = ppl(*args)
    assert second.exit_code == 0
    assert len((out / "rows.jsonl").read_text().splitlines()) == 9
    assert (out / "table.md").read_text() == table
    # a different spec on the same directory is refused
    other = ppl(*args[:-2], "--lengths", "32,64", "--out", str(out))
    assert other.exit_code == 2 and "different spec" in other.stderr


def test_interrupted_run_keeps_rows_and_resumes(tmp_path, tiny_model_dir, text_dir, monkeypatch):
    out = tmp_path / "run"
    args = [
        "--model",
        str(tiny_model_dir),
        "--data",
        str(text_dir),
        "--lengths",
        "32,64",
        "--method",
        "none",
        "--method",
        "pi:factor=2",
        "--method",
        "ntk:factor=2",
        "--out",
        str(out),
    ]
    real = P.PplRunner.measure
    calls = {"n": 0}

    def interrupt_second(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(self, *a, **k)

    monkeypatch.setattr(P.PplRunner, "measure", interrupt_second)
    result = ppl(*args)
    assert result.exit_code == 130 and "rerun the same command" in result.stderr
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "interrupted"
    kept = (out / "rows.jsonl").read_text().splitlines()
    assert len(kept) == 2  # the first method's two lengths survived
    monkeypatch.setattr(P.PplRunner, "measure", real)
    resumed = ppl(*args)
    assert resumed.exit_code == 0, resumed.output
    lines = (out / "rows.jsonl").read_text().splitlines()
    assert len(lines) == 6 and lines[:2] == kept
    assert json.loads((out / "run.json").read_text())["status"] == "success"


@pytest.mark.parametrize(
    "extra,fragment",
    [
        (["--method", "warp"], "unknown method"),
        (["--method", "pi:factor=0.5"], "factor must be >= 1"),
        (["--method", "yarn:beta_slow=32,beta_fast=1"], "beta_slow"),
        (["--lengths", "100000"], "longest of"),
        (["--data", "/no/such/file.txt"], "no such file"),
        (["--data", "hf:ctxeval-no-such/dataset"], "could not load hf:"),
        (["--protocol", "sliding", "--stride", "0"], "stride"),
        (["--data", "BINARY"], "not a text file"),
        (["--data", "EMPTY"], "empty.jsonl' is empty; give json records with a 'text' field"),
        (["--data", "HALF"], "half.jsonl' as json: JSON parse error: Missing a closing quotation mark"),
        (["--docs", "5", "--lengths", "32"], "--docs"),
        (["--lengths", "2k,abc"], "bad length"),
        (["--model", "ctxeval-test/no-such-model"], "could not load model"),
        (["--model", "./no/such/dir"], "neither a model directory"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, tiny_model_dir, text_dir, extra, fragment, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    binary = tmp_path / "blob.txt"
    binary.write_bytes(bytes(range(256)) * 10)
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "half.jsonl").write_text('{"text": "cut off')
    files = {"BINARY": binary, "EMPTY": tmp_path / "empty.jsonl", "HALF": tmp_path / "half.jsonl"}
    extra = [str(files.get(e, e)) for e in extra]
    args = ["--model", str(tiny_model_dir), "--data", str(text_dir), "--lengths", "32", "--out", str(tmp_path / "o")]
    for i in range(0, len(extra), 2):  # later flags override earlier ones
        if extra[i] in args:
            args[args.index(extra[i]) + 1] = extra[i + 1]
        else:
            args += extra[i : i + 2]
    result = ppl(*args)
    assert result.exit_code == 2, result.output
    assert fragment in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.output


def test_reading_a_record_file_leaves_datasets_logging_as_it_was(tmp_path):
    import datasets

    from ctxeval.data import corpora
    from ctxeval.errors import CtxevalError

    (tmp_path / "half.jsonl").write_text('{"text": "cut off')
    (tmp_path / "good.jsonl").write_text('{"text": "whole"}\n')
    datasets.logging.set_verbosity(datasets.logging.INFO)
    try:
        with pytest.raises(CtxevalError):
            list(corpora.iter_documents(str(tmp_path / "half.jsonl")))
        assert [d.text for d in corpora.iter_documents(str(tmp_path / "good.jsonl"))] == ["whole"]
        assert datasets.logging.get_verbosity() == datasets.logging.INFO and datasets.is_progress_bar_enabled()
    finally:
        datasets.logging.set_verbosity(datasets.logging.WARNING)


def test_task_preset_and_flags_override(tmp_path, tiny_model_dir, text_dir):
    task = tmp_path / "mine.toml"
    task.write_text(f'kind = "ppl"\ndata = "{text_dir}"\nlengths = "32,64"\nmethod = ["none", "pi:factor=2"]\n')
    result = ppl("--task", str(task), "--model", str(tiny_model_dir), "--lengths", "48", "--out", str(tmp_path / "r"))
    assert result.exit_code == 0, result.output
    run = json.loads((tmp_path / "r" / "run.json").read_text())
    assert run["spec"]["lengths"] == [48] and run["spec"]["methods"] == ["none", "pi(factor=2)"]
    assert ppl("--task", "no-such-preset").exit_code == 2


def test_model_without_rope_runs_none_and_refuses_methods(tmp_path, text_dir):
    from helpers import build_tokenizer
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = build_tokenizer()
    GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=len(tok), n_positions=128)).save_pretrained(
        tmp_path / "gpt2"
    )
    tok.save_pretrained(tmp_path / "gpt2")
    base = ["--model", str(tmp_path / "gpt2"), "--data", str(text_dir), "--lengths", "32,64"]
    bad = ppl(*base, "--method", "yarn:factor=2", "--out", str(tmp_path / "a"))
    assert bad.exit_code == 2 and "no RoPE" in bad.stderr
    ok = ppl(*base, "--method", "none", "--out", str(tmp_path / "b"))
    assert ok.exit_code == 0, ok.output
    run = json.loads((tmp_path / "b" / "run.json").read_text())
    assert run["model"]["rope"]["rotary_dim"] is None and run["methods"]["none"]["note"] == "model has no RoPE"


def test_runner_without_bos_token_scores_document_text_only():
    model = tiny_llama()
    doc = docs(1, 2 * L)[0]
    runner_ = P.PplRunner(model, "cpu", P.PplConfig((L,)), None, "tiny")  # tokenizer without BOS
    row = runner_._truncate_at(expand_specs(["none"])[0], doc, L)
    assert row["n_tokens"] == L - 1
    assert row["nll_sum"] == pytest.approx(float(full_nll(model, doc.ids[:L].tolist()).sum()), rel=1e-5)


# -- the survivors of mutmut 3.8.1 over perplexity.py's scoring functions (docs/testing.md)
def _windows(n, content, stride):
    """(begin, end) of each window by the protocol's definition: one every `stride` tokens, `content` doc tokens long,
    until the first that reaches the document's end: 1 + ceil((n - content) / stride) of them."""
    count = 1 + max(0, math.ceil((n - content) / stride))
    return [(i * stride, min(i * stride + content, n)) for i in range(count)]


@pytest.mark.parametrize("bos", [True, False])
@pytest.mark.parametrize("stride_part", [4, 2, 1])
def test_sliding_scores_every_token_once_whatever_the_document_length(bos, stride_part):
    model = tiny_llama()
    content = L if not bos else L - 1  # doc tokens per window (BOS takes one position)
    stride = (L - 1) // stride_part  # at most the L - 1 tokens a window scores
    cfg = P.PplConfig((L,), "sliding", stride=stride, bos=bos)
    runner_ = P.PplRunner(model, "cpu", cfg, 1 if bos else None, "tiny")
    (spec,) = expand_specs(["none"])
    for n in (
        2,
        3,
        content - 1,
        content,
        content + 1,
        2 * content + 1,
        stride + 1,
        2 * stride + 1,
        2 * stride + 2,
        3 * content - 5,
    ):  # 2 * stride + 1 / + 2: a last window of one / two tokens (with / without BOS)
        doc = TokenDoc(f"d{n}", np.random.default_rng(n).integers(2, TINY["vocab_size"], n))
        row = runner_._sliding_at(spec, doc, L)
        windows = _windows(n, content, stride)
        assert (row["length"], row["doc"], row["status"]) == (L, f"d{n}", "ok")
        assert row["n_tokens"] == (n if bos else n - 1), (n, stride, bos)  # each token once, none skipped
        assert row["n_windows"] == len(windows), (n, stride, bos)


def test_sliding_out_of_memory_halves_the_windows_per_forward_down_to_one(monkeypatch):
    from ctxeval.evals.common import PointOOM

    model = tiny_llama()
    doc = docs(1, 4 * L)[0]
    (spec,) = expand_specs(["none"])
    reference = P.PplRunner(model, "cpu", P.PplConfig((L,), "sliding", stride=L // 4), 1, "tiny")._sliding_at(
        spec, doc, L
    )
    notes = []
    progress = type("Progress", (), {"note": lambda self, text: notes.append(text)})()
    runner_ = P.PplRunner(
        model, "cpu", P.PplConfig((L,), "sliding", stride=L // 4, batch_size=4), 1, "tiny", progress=progress
    )
    real = runner_._nll_batch
    runner_._nll_batch = lambda seqs, finite=True: (
        (_ for _ in ()).throw(PointOOM("oom")) if len(seqs) > 1 else real(seqs, finite)
    )
    row = runner_._sliding_at(spec, doc, L)
    assert row["nll_sum"] == pytest.approx(reference["nll_sum"], rel=1e-9) and row["n_tokens"] == reference["n_tokens"]
    assert notes[:2] == [
        f"none: out of memory at {L} tokens; batch size 2",
        f"none: out of memory at {L} tokens; batch size 1",
    ]
    runner_._nll_batch = lambda seqs, finite=True: (_ for _ in ()).throw(PointOOM("oom"))
    with pytest.raises(PointOOM):  # one window per forward does not fit either: the point is given up
        runner_._sliding_at(spec, doc, L)


def overflow_at(monkeypatch, index, value):
    """Every forward's per-token loss at `index` replaced by `value` (an overflowing half-precision forward)."""
    real = P.token_nll

    def overflowing(model_, ids, chunk):
        nll = real(model_, ids, chunk).clone()
        nll[index] = value
        return nll

    monkeypatch.setattr(P, "token_nll", overflowing)


def test_a_non_finite_window_makes_a_sliding_point_an_error(tmp_path, monkeypatch):
    model = tiny_llama()
    overflow_at(monkeypatch, 5, float("nan"))
    store = RunStore(tmp_path / "r", {"t": 1})
    store.start({})
    P.sweep(FakeLM(model), expand_specs(["none"]), docs(1), P.PplConfig((L,), "sliding", stride=L // 2), store)
    (row,) = store.rows()
    assert (
        row["status"] == "error"
        and row["value"] is None
        and row["note"].startswith("non-finite NLL (nan) at position 6")
    )


def test_time_and_throughput_of_a_shared_forward_are_apportioned_by_tokens(monkeypatch):
    model = tiny_llama()
    clock = iter(range(100, 1000, 2))  # every perf_counter call 2 s later than the last
    monkeypatch.setattr(P.time, "perf_counter", lambda: float(next(clock)))
    runner_ = P.PplRunner(model, "cpu", P.PplConfig((L // 2, L)), 1, "tiny")
    (spec,) = expand_specs(["none"])
    rows = runner_._truncate_one_forward(spec, docs(1)[0], [L // 2, L])
    # the forward: perf_counter at 2 and 4 inside _nll_batch (2 s, L tokens), at 0 and 6 around it (6 s)
    assert [r["seconds"] for r in rows] == [round(6 * (L // 2 - 1) / (L - 1), 3), 6.0]
    assert [r["tokens_per_s"] for r in rows] == [round(L / 2, 1)] * 2


def test_sliding_time_and_throughput_add_up_over_the_windows(monkeypatch):
    model = tiny_llama()
    clock = iter(range(100, 10000, 2))
    monkeypatch.setattr(P.time, "perf_counter", lambda: float(next(clock)))
    runner_ = P.PplRunner(model, "cpu", P.PplConfig((L,), "sliding", stride=L // 2), 1, "tiny")
    (spec,) = expand_specs(["none"])
    doc = docs(1, 3 * L)[0]
    row = runner_._sliding_at(spec, doc, L)
    windows = _windows(3 * L, L - 1, L // 2)
    tokens = sum(end - begin + 1 for begin, end in windows)  # BOS + the window's tokens, per forward
    # perf_counter: once at the start, twice per window's forward (2 s each), once at the end
    assert row["seconds"] == 2 * (2 * len(windows) + 1)
    assert row["tokens_per_s"] == round(tokens / (2 * len(windows)), 1)


def test_every_length_past_a_non_finite_loss_is_an_error_row(monkeypatch):
    model = tiny_llama()
    overflow_at(monkeypatch, 40, float("inf"))
    runner_ = P.PplRunner(model, "cpu", P.PplConfig((32, 48, 64)), 1, "tiny")
    (spec,) = expand_specs(["none"])
    rows = runner_._truncate_one_forward(spec, docs(1)[0], [32, 48, 64])
    assert [(r["length"], r["status"]) for r in rows] == [(32, "ok"), (48, "error"), (64, "error")]


@pytest.mark.parametrize("method, bos", [("none", False), ("dynamic-ntk:factor=2", True)])
def test_a_key_token_at_the_last_position_counts_in_that_lengths_longppl(method, bos):
    """Key tokens at positions 31, 32 and 63 of a document measured at 32 and 64 tokens (a random tiny Llama,
    trained length 64; `none` scores both lengths from one forward, dynamic NTK each in its own). At 32 the only key
    token inside the sequence is its last one, position 31 (predicted by the 31st loss); 32 is the first token past
    it. So: 1 key token at 32 with LongPPL exp(loss of token 31), 3 at 64; the losses from a plain forward."""
    from ctxeval.data.corpora import TokenDoc
    from ctxeval.evals import perplexity as P
    from ctxeval.rope.patching import apply_method

    model = tiny_llama()
    spec = expand_specs([method])[0]
    doc = TokenDoc("d", np.random.default_rng(3).integers(2, 128, 200))
    keys = np.array([31, 32, 63])
    bos_id = 1
    run = P.PplRunner(model, "cpu", P.PplConfig((32, 64), bos=bos), bos_id, "tiny")
    run.key_positions = {"d": keys}
    rows = []
    with apply_method(model, spec.name, **spec.params):
        run.measure(spec, doc, [32, 64], rows.extend)
        want = {}
        for length in (32, 64):
            seq = ([bos_id] if bos else []) + doc.ids[: length - (1 if bos else 0)].tolist()
            assert len(seq) == length
            with torch.no_grad():
                logits = model(torch.tensor([seq])).logits[0, :-1].double()
            losses = F.cross_entropy(logits, torch.tensor(seq[1:]), reduction="none").numpy()  # losses[t - 1]: token t
            inside = [int(t) for t in keys if t < length]
            want[length] = (len(inside), float(sum(losses[t - 1] for t in inside)))
    assert want[32][0] == 1 and want[64][0] == 3
    got = {r["length"]: r for r in rows}
    assert sorted(got) == [32, 64] and all(r["status"] == "ok" for r in rows)
    for length, (n, total) in want.items():
        assert got[length]["key_tokens"] == n, (
            f"at {length} tokens {got[length]['key_tokens']} key token(s) counted, {n} inside the sequence "
            f"(positions {[int(t) for t in keys if t < length]})"
        )
        assert got[length]["key_nll_sum"] == pytest.approx(total, rel=1e-4, abs=1e-5)
    lp = tables.longppl_long(rows).set_index("length")
    assert lp.loc[32, "longppl"] == pytest.approx(math.exp(want[32][1]), rel=1e-4)
    assert lp.loc[64, "longppl"] == pytest.approx(math.exp(want[64][1] / 3), rel=1e-4)
