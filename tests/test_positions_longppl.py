"""Loss by position and LongPPL: bucket sums against per-token losses written out here, the one-forward curve against
separate forwards, key tokens against a from-scratch transcription of LongPPL's find_key_token, and the CLI end to
end (files, cache, resume, bad input)."""

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import TINY, tiny_llama
from test_ppl import FakeLM, docs
from typer.testing import CliRunner

from ctxeval.cli import app
from ctxeval.errors import CtxevalError
from ctxeval.evals import key_tokens as K
from ctxeval.evals import perplexity as P
from ctxeval.evals.positions import bucket_sums, default_edges, parse_position_buckets
from ctxeval.report import tables
from ctxeval.runs.store import RunStore
from ctxeval.specs import expand_specs

runner = CliRunner()
L = TINY["max_position_embeddings"]


def hf_nll(model, seq):
    """Per-token loss from the model's own logits: hf_nll[t - 1] is the loss of seq[t] given seq[:t]."""
    ids = torch.tensor([seq])
    with torch.no_grad():
        logits = model(ids).logits[0, :-1].float()
    return F.cross_entropy(logits, ids[0, 1:], reduction="none").double().numpy()


def store_at(tmp_path, name="run"):
    store = RunStore(tmp_path / name, {"t": 1})
    store.start({})
    return store


# ------------------------------------------------------------------------------------------------ bucket edges


def test_default_edges_are_octaves_with_the_trained_length():
    assert default_edges(1024, 128) == (1, 32, 64, 128, 256, 512, 1024)
    assert default_edges(16384, 6000) == (1, 32, 64, 128, 256, 512, 1024, 2048, 4096, 6000, 8192, 16384)
    assert default_edges(48, 16) == (1, 16, 32, 48)
    assert parse_position_buckets("4", 1024, 128) == (1, 6, 32, 181, 1024)  # 1024 ** (i / 4), rounded
    assert parse_position_buckets("0,1k,4k,8k", 8192, None) == (0, 1024, 4096, 8192)
    assert parse_position_buckets("1", 1024, 128) == (1, 1024)  # one bucket is allowed (mutmut found it untested)


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("1,4,4,8", "increase strictly"),
        ("8,4", "increase strictly"),
        ("1,2k,x", "not a token count"),
        ("0", ">= 1 bucket"),
        ("many", "bucket count"),
    ],
)
def test_bad_bucket_edges_are_refused(text, fragment):
    with pytest.raises(CtxevalError, match=fragment):
        parse_position_buckets(text, 1024, 128)


def test_bucket_sums_equal_a_direct_loop():
    nll = np.random.default_rng(1).random(300)
    edges = (1, 2, 4, 8, 16, 32, 64, 128, 200, 256)
    sums, counts = bucket_sums(nll, 1, edges)
    for i, (a, b) in enumerate(zip(edges, edges[1:])):
        inside = [nll[p - 1] for p in range(1, 301) if a <= p < b]  # position p = index + 1
        assert counts[i] == len(inside) and sums[i] == pytest.approx(sum(inside))
    # positions past the last edge (256..300) are not counted; a window starting later shifts every position
    assert sum(counts) == 255
    late_sums, late_counts = bucket_sums(nll[:10], 100, edges)
    assert late_counts[edges.index(64)] == 10 and late_sums[edges.index(64)] == pytest.approx(nll[:10].sum())


# --------------------------------------------------------------------------------------- loss by position: runs


@pytest.mark.parametrize("method", ["none", "yarn:factor=4"])
def test_one_forward_bucket_curve_equals_separate_forwards_and_per_token_losses(tmp_path, method):
    model = tiny_llama()
    lengths = (L // 2, L, 2 * L, 4 * L)
    edges = default_edges(max(lengths), L)
    spec = expand_specs([method])[0]
    documents = docs()
    one = store_at(tmp_path, "one")
    P.sweep(FakeLM(model), [spec], documents, P.PplConfig(lengths, position_edges=edges), one)
    separate = store_at(tmp_path, "separate")
    runner_ = P.PplRunner(model, "cpu", P.PplConfig(lengths, position_edges=edges), 1, "tiny")
    runner_.dynamic = {spec.label}  # one forward per length, as a length-dependent method runs
    from ctxeval.rope.patching import apply_method

    with apply_method(model, spec.name, **spec.params):
        for doc in documents:
            runner_.measure(spec, doc, list(lengths), separate.append)
        want_by_doc = {d.doc_id: hf_nll(model, [1] + d.ids[: max(lengths) - 1].tolist()) for d in documents}
    got_one = {(r["doc"], r["length"]): r for r in one.rows()}
    got_sep = {(r["doc"], r["length"]): r for r in separate.rows()}
    for doc in documents:
        for length in lengths:
            a, b = got_one[(doc.doc_id, length)], got_sep[(doc.doc_id, length)]
            assert a["position_edges"] == list(edges) and a["position_tokens"] == b["position_tokens"]
            np.testing.assert_allclose(a["position_nll_sum"], b["position_nll_sum"], rtol=1e-4, atol=1e-6)
            # against the model's own logits, bucket by bucket, positions 1 .. length - 1
            want = want_by_doc[doc.doc_id][: length - 1]
            for i, (lo, hi) in enumerate(zip(edges, edges[1:])):
                picked = [want[p - 1] for p in range(1, length) if lo <= p < hi]
                assert a["position_tokens"][i] == len(picked)
                assert a["position_nll_sum"][i] == pytest.approx(sum(picked), rel=1e-4, abs=1e-6)
            assert sum(a["position_nll_sum"]) == pytest.approx(a["nll_sum"], rel=1e-9)
    # the report's curve: token-weighted over documents at the longest length
    pos = tables.positions_long(one.rows()).set_index(["start", "stop"])
    longest = [got_one[(d.doc_id, max(lengths))] for d in documents]
    for i, (lo, hi) in enumerate(zip(edges, edges[1:])):
        total = sum(r["position_nll_sum"][i] for r in longest)
        n = sum(r["position_tokens"][i] for r in longest)
        assert pos.loc[(lo, hi), "ppl"] == pytest.approx(math.exp(total / n))
        assert pos.loc[(lo, hi), "length"] == max(lengths) and pos.loc[(lo, hi), "n_docs"] == 2


def test_sliding_positions_are_positions_in_the_window(tmp_path):
    model = tiny_llama()
    doc = docs(1, 3 * L + 17)[0]
    stride, edges = L // 4, (1, 16, 48, L)
    cfg = P.PplConfig((L,), "sliding", stride=stride, position_edges=edges)
    row = P.PplRunner(model, "cpu", cfg, 1, "tiny")._sliding_at(expand_specs(["none"])[0], doc, L)
    sums, counts, scored = np.zeros(3), np.zeros(3, dtype=int), 0
    for begin in range(0, len(doc.ids), stride):
        end = min(begin + L - 1, len(doc.ids))
        nll = hf_nll(model, [1] + doc.ids[begin:end].tolist())  # nll[j]: window position j + 1
        for j in range(scored - begin, len(nll)):
            b = np.searchsorted(edges, j + 1, side="right") - 1
            if 0 <= b < 3:
                sums[b] += nll[j]
                counts[b] += 1
        scored = end
        if end == len(doc.ids):
            break
    assert row["position_tokens"] == list(counts)
    np.testing.assert_allclose(row["position_nll_sum"], sums, rtol=1e-4)
    # the first window scores positions 1..63; every later window only its last 16 positions (48..63)
    assert list(counts) == [15, 32, len(doc.ids) - 47]


# ------------------------------------------------------------------------------------------------------ LongPPL


def reference_key_tokens(model, seq, trunc_len, internal, alpha=2.0, beta=2.0):
    """PKU-ML/LongPPL longppl.py find_key_token, transcribed (full logits, one short forward per window; its
    constants 2 and 2 as alpha and beta)."""
    input_ids = torch.tensor([seq])
    with torch.no_grad():
        output_full = model(input_ids).logits
    loss_f = torch.nn.CrossEntropyLoss(reduction="none")
    max_len = input_ids.shape[1]
    key_tokens = []
    with torch.no_grad():
        for start_token in range(0, max_len - trunc_len, internal):
            if start_token + trunc_len + internal > max_len:
                internal = max_len - start_token - trunc_len
            input_ids_short = input_ids[:, start_token : start_token + trunc_len + internal]
            output_short = model(input_ids_short).logits
            loss_full = loss_f(
                output_full[0, start_token + trunc_len - 1 : start_token + trunc_len + internal - 1],
                input_ids[0, start_token + trunc_len : start_token + trunc_len + internal],
            )
            loss_short = loss_f(
                output_short[0, trunc_len - 1 : trunc_len + internal - 1],
                input_ids_short[0, trunc_len : trunc_len + internal],
            )
            is_key = torch.logical_and((loss_short - loss_full) > alpha, loss_full < beta)
            key_tokens += [start_token + trunc_len + i for i, k in enumerate(is_key) if k]
    return key_tokens


def test_key_positions_equal_longppl_find_key_token():
    model = tiny_llama(seed=3)
    seq = [1] + docs(1, 300, seed=4)[0].ids.tolist()
    # a random model gains little from long context: loose thresholds give key tokens to compare, LongPPL's own
    # (2, 2) give none, and both must agree with the transcription
    for context, window, alpha, beta in (
        (64, 16, 0.02, 6.0),
        (50, 7, 0.02, 6.0),
        (100, 25, 0.01, 5.0),
        (64, 16, 2.0, 2.0),
    ):
        want = reference_key_tokens(model, seq, context, window, alpha, beta)
        got = K.key_positions(model, "cpu", seq, context, window, alpha, beta, chunk_size=33)
        assert got.tolist() == want
        assert all(t >= context for t in got)
        assert len(want) > 5 or alpha == 2.0


def test_thresholds_decide_key_tokens(monkeypatch):
    """alpha and beta bite: with every short loss 3 above the long one, the tokens whose long loss is < beta = 2 are
    keys; with 1.5 above (< alpha = 2), none is."""
    long = torch.tensor([0.5, 1.0, 1.9, 2.1, 5.0, 0.1], dtype=torch.float64)  # long[t - 1]: token t
    for gap, want in ((3.0, [1, 2, 3, 6]), (1.5, [])):

        def fake(model, ids, chunk, gap=gap):
            first, n = int(ids[0, 0]), ids.shape[1] - 1  # the sequence is 0..6, so ids[0, 0] is the window start
            return long.clone() if ids.shape[1] == 7 else long[first : first + n].clone() + gap

        monkeypatch.setattr(K, "token_nll", fake)
        assert K.key_positions(None, "cpu", list(range(7)), context=1, window=5).tolist() == want


def test_longppl_end_to_end_same_key_tokens_for_every_method(tmp_path, monkeypatch):
    """The bundled tiny model (trained on 128 tokens) as its own evaluator on two CPython docs at 1k: as LongPPL, the
    evaluated model reads the document without BOS and the evaluator BOS + the same tokens (its tokenizer's
    default); the key tokens equal the transcription's on the evaluator's input, one position earlier in the evaluated
    sequence; every method is scored on them; LongPPL is exp(summed key NLL / key tokens) over the documents (the
    original's aggregate; tests/test_longppl_original.py runs the original itself), computed here from the model's
    own logits; a resume reuses key-tokens.json."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ctxeval.data.corpora import select_long_documents
    from ctxeval.rope.patching import apply_method
    from ctxeval.tiny import MODEL_DIR

    tok = AutoTokenizer.from_pretrained(MODEL_DIR)
    out = tmp_path / "run"
    args = [
        "ppl",
        "--model",
        "tiny",
        "--docs",
        "2",
        "--lengths",
        "256,512,1k",
        "-m",
        "none",
        "-m",
        "pi:factor=4",
        "--key-tokens",
        "tiny",
        "--key-tokens-method",
        "none",
        "--out",
        str(out),
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    run = json.loads((out / "run.json").read_text())
    cache = json.loads((out / K.CACHE_FILE).read_text())
    assert run["key_tokens"]["context"] == 64 and run["key_tokens"]["window"] == 16  # half of 128, a quarter of it
    assert run["spec"]["key_tokens"]["evaluator"] == "tiny" and run["spec"]["bos"] is False
    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR).eval()
    documents = select_long_documents("pydoc", tok, 2, 1024)
    sequences = {d.doc_id: d.ids[:1024].tolist() for d in documents}
    rows = [json.loads(l) for l in (out / "rows.jsonl").read_text().splitlines()]
    for doc, seq in sequences.items():
        want_keys = [t - 1 for t in reference_key_tokens(model, [tok.bos_token_id] + seq, 64, 16)]
        assert cache["documents"][doc]["positions"] == want_keys
        for length in (256, 512, 1024):
            mine = [r for r in rows if r["doc"] == doc and r["length"] == length]
            assert len(mine) == 2 and len({r["key_tokens"] for r in mine}) == 1  # every method: the same tokens
            assert mine[0]["key_tokens"] == sum(1 for t in want_keys if t < length)
    assert sum(len(d["positions"]) for d in cache["documents"].values()) > 5
    lp = tables.longppl_long(rows).set_index(["label", "length"])
    for label, spec in (("none", None), ("pi(factor=4)", expand_specs(["pi:factor=4"])[0])):
        key_nll = []
        for doc, seq in sequences.items():
            if spec is None:
                nll = hf_nll(model, seq)
            else:
                with apply_method(model, spec.name, **spec.params):
                    nll = hf_nll(model, seq)
            key_nll += [nll[t - 1] for t in cache["documents"][doc]["positions"]]
        assert lp.loc[(label, 1024), "longppl"] == pytest.approx(math.exp(np.mean(key_nll)), rel=1e-4)
        assert lp.loc[(label, 1024), "key_tokens"] == len(key_nll)
    assert (out / "longppl.csv").exists() and "LongPPL" in (out / "table.md").read_text()
    assert (out / "positions.csv").exists() and (out / "positions.png").stat().st_size > 0
    # resume: key-tokens.json is reused (finding them again would fail), nothing is re-measured
    monkeypatch.setattr(K, "key_positions", lambda *a, **k: (_ for _ in ()).throw(AssertionError("found again")))
    again = runner.invoke(app, args)
    assert again.exit_code == 0, again.output
    assert len((out / "rows.jsonl").read_text().splitlines()) == len(rows)


def test_longppl_aggregate_is_the_pooled_key_token_perplexity():
    """Two documents whose LongPPL differ (e^1 over 3 key tokens, e^3 over 1): the original aggregates
    exp((3 ln e^1 + 1 ln e^3) / 4) = e^1.5; an arithmetic mean weighted by the counts would give (3e + e^3) / 4."""
    rows = [
        {"model": "m", "label": "x", "length": 8, "doc": d, "status": "ok", "key_nll_sum": s, "key_tokens": n}
        for d, s, n in (("a", 3.0, 3), ("b", 3.0, 1), ("c", 0.0, 0))
    ]
    lp = tables.longppl_long(rows)
    assert lp.loc[0, "longppl"] == pytest.approx(math.exp(1.5)) and lp.loc[0, "key_tokens"] == 4
    assert lp.loc[0, "n_docs"] == 3 and lp.loc[0, "status"] == "ok"


@pytest.mark.parametrize(
    "extra, fragment",
    [
        (["--key-tokens-context", "128"], "not shorter than the longest length"),
        (["--protocol", "sliding", "--stride", "32"], "use --protocol truncate"),
        (["--key-tokens-method", "dynamic-ntk"], "depends on the sequence length"),
    ],
)
def test_longppl_bad_input_is_one_line_exit_2(tmp_path, tiny_model_dir, text_dir, extra, fragment):
    result = runner.invoke(
        app,
        [
            "ppl",
            "--model",
            str(tiny_model_dir),
            "--data",
            str(text_dir),
            "--lengths",
            "64,128",
            "--key-tokens",
            str(tiny_model_dir),
            "--out",
            str(tmp_path / "r"),
            *extra,
        ],
    )
    assert result.exit_code == 2, result.output
    assert fragment in result.stderr and "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1


def test_evaluator_with_another_tokenizer_is_refused(tmp_path, tiny_model_dir, text_dir):
    from ctxeval.tiny import MODEL_DIR

    result = runner.invoke(
        app,
        [
            "ppl",
            "--model",
            str(tiny_model_dir),
            "--data",
            str(text_dir),
            "--lengths",
            "64,128",
            "--key-tokens",
            str(MODEL_DIR),
            "--key-tokens-context",
            "32",
            "--out",
            str(tmp_path / "r"),
        ],
    )
    assert result.exit_code == 2, result.output
    assert "another tokenizer" in result.stderr


def test_bad_position_buckets_fail_before_loading(tmp_path, text_dir):
    result = runner.invoke(
        app,
        [
            "ppl",
            "--model",
            "/nonexistent",
            "--data",
            str(text_dir),
            "--lengths",
            "64,128",
            "--position-buckets",
            "1,64,32",
            "--out",
            str(tmp_path / "r"),
        ],
    )
    assert result.exit_code == 2 and "increase strictly" in result.stderr
