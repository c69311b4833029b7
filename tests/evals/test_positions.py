"""Loss by position and LongPPL: bucket sums against per-token losses written out here, the one-forward curve against
separate forwards, key tokens against a from-scratch transcription of LongPPL's find_key_token, and the CLI end to
end (files, cache, resume, bad input)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from evals.fake_lm import FakeLM, docs
from helpers import TINY, tiny_llama

from ctxeval.errors import CtxevalError
from ctxeval.evals import perplexity as P
from ctxeval.evals.positions import MAX_BUCKETS, bucket_sums, default_edges, key_sums, parse_position_buckets
from ctxeval.report import tables
from ctxeval.runs.store import RunStore
from ctxeval.specs import expand_specs

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


def test_default_edges_without_a_trained_length_are_the_octaves():
    assert default_edges(1024) == (1, 32, 64, 128, 256, 512, 1024)
    assert default_edges(1024, None) == default_edges(1024, 0) == (1, 32, 64, 128, 256, 512, 1024)


def test_a_trained_length_of_two_tokens_is_its_own_edge():
    assert default_edges(48, 2) == (1, 2, 32, 48)
    assert default_edges(48, 1) == (1, 32, 48)  # 1 is already the first edge


def test_default_edges_are_exact_powers_of_two_below_a_short_length():
    assert default_edges(40) == (1, 32, 40)
    assert default_edges(32) == (1, 32)
    assert default_edges(16) == (1, 16)  # shorter than the first octave: one bucket
    assert all(isinstance(e, int) for e in default_edges(5000, 3000))


@pytest.mark.parametrize("text", [None, "", "   ", "\t"])
def test_no_position_buckets_means_octaves_with_the_trained_length(text):
    assert parse_position_buckets(text, 1024, 100) == (1, 32, 64, 100, 128, 256, 512, 1024)


def test_a_bucket_count_above_the_limit_names_the_range():
    with pytest.raises(
        CtxevalError,
        match=rf"^--position-buckets must be a bucket count in 1\.\.{MAX_BUCKETS}, "
        r"got '1025'$",
    ):
        parse_position_buckets("1025", 4096, None)
    edges = parse_position_buckets(str(MAX_BUCKETS), 10**6, None)  # the limit itself is allowed
    assert edges[:3] == (1, 2, 3) and edges[-1] == 10**6


def test_a_word_for_a_bucket_count_gets_the_usage_message():
    with pytest.raises(CtxevalError, match=r"^--position-buckets takes a bucket count \(e\.g\. 16\) or edges"):
        parse_position_buckets("many", 1024, None)
    with pytest.raises(CtxevalError, match=r"^--position-buckets takes a bucket count \(e\.g\. 16\) or edges"):
        parse_position_buckets("2.5", 1024, None)


def test_at_most_1025_edges():
    allowed = ",".join(str(i) for i in range(MAX_BUCKETS + 1))
    assert parse_position_buckets(allowed, 4096, None) == tuple(range(MAX_BUCKETS + 1))
    with pytest.raises(CtxevalError, match=r"^--position-buckets takes at most 1025 edges, got 1026$"):
        parse_position_buckets(",".join(str(i) for i in range(MAX_BUCKETS + 2)), 4096, None)


def test_one_edge_is_refused_with_the_text():
    with pytest.raises(CtxevalError, match=r"^--position-buckets needs at least two edges, got '5,'$"):
        parse_position_buckets("5,", 1024, None)


def test_a_bad_edge_names_the_option():
    with pytest.raises(CtxevalError, match=r"^--position-buckets: 'x' is not a token count"):
        parse_position_buckets("1,x", 1024, None)
    with pytest.raises(CtxevalError, match=r"^--position-buckets: '-4' must be a whole number of tokens >= 0"):
        parse_position_buckets("-4,8", 1024, None)


def test_key_sums_add_float32_losses_in_float64():
    # float32 addition would drop each 1.0 next to 2**24; the sum is exact in float64
    nll = np.array([2.0**24, 1.0, 1.0, 1.0, 1.0, 5.0], dtype=np.float32)
    total, count = key_sums(nll, np.array([1, 2, 3, 4, 5, 6]), 6)
    assert (total, count) == (2.0**24 + 4.0, 5)
