"""tiny/train.py: the retrieval sequences and a smoke run of the train loop."""

import json

import numpy as np
import pytest
import torch

from ctxeval.tiny import corpus as D


def _small_cfg(**kw):
    from ctxeval.tiny.train import TinyConfig

    base = dict(
        length=256,
        vocab_size=700,
        hidden_size=32,
        intermediate_size=64,
        num_layers=1,
        num_heads=2,
        steps=3,
        batch_size=4,
        warmup=1,
        seed=0,
        mix={"lm": 0.25, "needle": 0.25, "recall": 0.25, "repeat": 0.25},
    )
    return TinyConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def small_corpus():
    topics = D.training_topics()
    return {
        "pydoc": [t for _, t in topics[:30]],
        "docstrings": [t for _, t in topics[30:45]],
        "sources": [t for _, t in topics[45:]],
        "retrieval": D.retrieval_lines(200),
    }


def test_retrieval_sequences_match_the_needle_layout(small_corpus):
    from ctxeval.tiny.train import Batches, train_tokenizer

    cfg = _small_cfg(retrieval_kinds={"ruler": [1.0, "text"]})
    texts = [t for part in small_corpus.values() for t in part]
    tok = train_tokenizer(texts, cfg.vocab_size)
    batches = Batches(tok, cfg, small_corpus)
    for _ in range(5):
        ids, weights = batches.retrieval()
        assert ids.shape == weights.shape == (cfg.length,)
        assert ids[0] == tok.bos_token_id
        answer = ids[weights == cfg.answer_weight]
        assert len(answer) == 8  # " " + 7 digits
        assert tok.decode(answer.tolist()).strip().isdigit()
        text = tok.decode(ids.tolist())
        assert "Some special magic numbers are hidden" in text and "mentioned in the provided text is" in text
        assert ids.tolist().count(tok.bos_token_id) == 1
    ids, weights, kinds = batches.next()
    assert ids.shape == (cfg.batch_size, cfg.length) and weights.shape == ids.shape and len(kinds) == cfg.batch_size
    for make in (batches.recall, batches.repeat, batches.lm):
        for _ in range(5):
            ids, weights = make()
            assert ids.shape == weights.shape == (cfg.length,) and ids[0] == tok.bos_token_id


def test_train_smoke_three_steps(tmp_path, small_corpus):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ctxeval.tiny.train import train

    logs = []
    summary = train(tmp_path / "m", _small_cfg(), corpus=small_corpus, log=logs.append, evaluate=False)
    assert summary["steps"] == 3 and summary["history"][-1]["step"] == 3
    assert np.isfinite(summary["history"][-1]["loss"])
    out = tmp_path / "m"
    assert json.loads((out / "training_log.json").read_text())["config"]["length"] == 256
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert model.config.max_position_embeddings == 256 and len(tok) == model.config.vocab_size
    with torch.inference_mode():
        assert torch.isfinite(model(input_ids=torch.tensor([[tok.bos_token_id, 5, 6]])).logits).all()
