"""evals/tune/needles.py and --objective needle / both: the needle documents (length, where the keys and their answers
sit, which tokens are the document's own) and the answer perplexity, recomputed with a plain forward."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

TARGET = 512


@pytest.fixture(scope="module")
def tiny():
    from ctxeval.models.load import load_model

    return load_model("tiny", dtype="float32", device="cpu")


@pytest.fixture(scope="module")
def doc(tiny):
    from ctxeval.data.corpora import select_long_documents

    return select_long_documents("pydoc", tiny.tokenizer, 1, TARGET)[0]


def test_a_needle_document_fills_the_length_with_its_keys_at_evenly_spaced_depths(tiny, doc):
    """Brute force: decode the answer targets (the next tokens after each target index) back to the keys, the needle
    lines sit at (i + 1/2) / 5 of the document part, and the document's own targets are exactly its first tokens in
    order. Bug caught: answer indices off by one (the loss read on the token before the key), the needle lines
    scored as the document's own tokens, or the document cut past the length."""
    from ctxeval.evals.tune.needles import NEEDLES_PER_DOC, build_needle_doc

    bos = tiny.tokenizer.bos_token_id
    nd = build_needle_doc(doc, tiny.tokenizer, TARGET, bos, np.random.default_rng(0))
    assert len(nd.ids) == TARGET and nd.ids[0] == bos and len(nd.keys) == NEEDLES_PER_DOC
    answers = tiny.tokenizer.decode([nd.ids[t + 1] for t in nd.answer_targets]).replace(" ", "")
    assert answers == "".join(str(k) for k in nd.keys)
    own = [nd.ids[t + 1] for t in nd.doc_targets]
    assert own == doc.ids[: len(own)].tolist()
    text = tiny.tokenizer.decode(nd.ids)
    for i, key in enumerate(nd.keys, 1):
        assert f"The pass key number {i} is {key}. Remember it." in text
        assert text.rstrip().endswith(f"The pass key number {NEEDLES_PER_DOC} is {nd.keys[-1]}.")
    # depth of needle i: the document tokens before it / all document tokens
    positions = np.asarray(nd.doc_targets) + 1
    n_doc = len(positions)
    gaps = np.nonzero(np.diff(positions) > 1)[0]  # the document's token before each needle line
    depths = (gaps + 1) / n_doc
    assert depths == pytest.approx([(i + 0.5) / NEEDLES_PER_DOC for i in range(NEEDLES_PER_DOC)], abs=2 / n_doc)


def test_split_nll_sums_the_right_positions():
    """Synthetic NLL nll[t] = t: the sums are the sums of the index sets, cut at `length` - 1. Bug caught: the cut at
    `length` (one target too many), or the answers counted in the document's sum."""
    from ctxeval.evals.tune.needles import NeedleDoc, split_nll

    doc = NeedleDoc("d", list(range(20)), np.asarray([0, 1, 2, 5, 6, 9]), np.asarray([14, 15, 18]), (1,))
    nll = np.arange(19, dtype=np.float64)
    full = split_nll(doc, nll)
    assert (full.doc_nll, full.doc_tokens, full.answer_nll, full.answer_tokens) == (23.0, 6, 47.0, 3)
    short = split_nll(doc, nll, 10)  # targets t < 9
    assert (short.doc_nll, short.doc_tokens, short.answer_tokens) == (14.0, 5, 0)
    assert math.isnan(short.answer_ppl)


def test_a_document_too_short_for_the_keys_is_refused(tiny, doc):
    from ctxeval.data.corpora import TokenDoc
    from ctxeval.errors import CtxevalError
    from ctxeval.evals.tune.needles import build_needle_doc

    short = TokenDoc("short", doc.ids[:100])
    with pytest.raises(CtxevalError, match="cannot fill 512 tokens with 5 pass keys"):
        build_needle_doc(short, tiny.tokenizer, TARGET, 1, np.random.default_rng(0))


@pytest.mark.parametrize("objective", ["needle", "both"])
def test_the_needle_score_is_the_answer_nll_of_a_plain_forward(tiny, doc, objective):
    """TrialScorer's needle path against a plain float64 log-softmax of the model's logits with YaRN applied: answer
    perplexity, own-token perplexity at the target and at 128 (the same causal forward), and the objective value
    (the answer ppl, or the geometric mean). Bug caught: the trained length's ppl taken over the whole forward, the
    answers' NLL averaged per key instead of per token, or the geometric mean replaced by the product."""
    from ctxeval.evals.tune.needles import build_needle_doc, objective_value
    from ctxeval.evals.tune.scoring import TrialScorer, TuneConfig
    from ctxeval.rope.patching import apply_method
    from ctxeval.specs import expand_specs

    cfg = TuneConfig(TARGET, 128, objective=objective, seed=3)
    spec = expand_specs(["yarn:factor=4,beta_fast=4,beta_slow=0.25"])[0]
    score = TrialScorer(tiny, [doc], cfg).score(spec)
    nd = build_needle_doc(doc, tiny.tokenizer, TARGET, tiny.tokenizer.bos_token_id, np.random.default_rng([3, 0]))
    with apply_method(tiny.model, "yarn", tiny.rope.geometry, factor=4, beta_fast=4, beta_slow=0.25):
        with torch.no_grad():
            logits = tiny.model(torch.tensor([nd.ids])).logits[0].double()
    logp = torch.log_softmax(logits, dim=-1)
    nll = -logp[torch.arange(TARGET - 1), torch.tensor(nd.ids[1:])].numpy()  # (TARGET - 1,)
    answer = math.exp(nll[nd.answer_targets].mean())
    own = math.exp(nll[nd.doc_targets].mean())
    early = nd.doc_targets[nd.doc_targets < 127]
    assert score.answer_ppl == pytest.approx(answer, rel=1e-4)
    assert score.target_ppl == pytest.approx(own, rel=1e-4)
    assert score.short_ppl == pytest.approx(math.exp(nll[early].mean()), rel=1e-4)
    want = answer if objective == "needle" else math.sqrt(own * answer)
    assert objective_value(objective, score.target_ppl, score.answer_ppl) == pytest.approx(want, rel=1e-4)


def test_objective_needle_through_the_cli_rows_and_refusals(tmp_path):
    """A needle search's rows carry the answer ppl as `value` and the document ppl beside it; an unknown --objective
    is one line, exit 2, before the model loads. Bug caught: `value` left at the document ppl (the search would
    optimise perplexity while the run says retrieval)."""
    import json

    from typer.testing import CliRunner

    from ctxeval.cli import app

    runner = CliRunner()
    bad = runner.invoke(app, ["tune", "--target-length", "512", "--objective", "recall", "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "--objective must be one of ppl, needle, both" in bad.output
    assert not (tmp_path / "x").exists()
    out = tmp_path / "run"
    args = ["--target-length", "512", "--tune-docs", "1", "--heldout-docs", "1", "--trials", "3", "--out", str(out)]
    result = runner.invoke(app, ["tune", *args, "--objective", "needle"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(x) for x in (out / "rows.jsonl").read_text().splitlines()]
    ok = [r for r in rows if r["status"] == "ok"]
    assert ok and all(r["value"] == r["answer_ppl"] and r["metric"] == "answer_ppl" for r in ok)
    assert all(r["value"] != r["ppl_target"] for r in ok)
    assert "answer perplexity of 5 pass keys" in (out / "tune.md").read_text()
