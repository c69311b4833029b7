"""tiny/corpus.py: the held-out split of the tiny model's corpus."""

import pytest
import torch

from ctxeval.tiny import MODEL_DIR
from ctxeval.tiny import corpus as D

TRAINED_LENGTH = 128


@pytest.fixture(scope="module")
def bundled(tmp_path_factory):
    """Tokenizer + model from MODEL_DIR with the hub switched off."""
    import os

    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not (MODEL_DIR / "model.safetensors").is_file():
        pytest.skip(f"no bundled model in {MODEL_DIR}; run python -m ctxeval.tiny train")
    old = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        tok = AutoTokenizer.from_pretrained(MODEL_DIR)
        model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32).eval()
    finally:
        if old is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = old
    return tok, model


def test_held_out_docs_long_enough(bundled):
    """The truncate protocol needs several held-out documents of at least 16x the trained length."""
    tok, _ = bundled
    lengths = [len(tok(text, add_special_tokens=False)["input_ids"]) for _, text in D.held_out_documents()]
    assert sum(n >= 16 * TRAINED_LENGTH for n in lengths) >= 3


def test_held_out_split_is_deterministic_and_longest_first():
    docs = D.held_out_documents()
    assert docs == D.held_out_documents()
    assert docs[0][0] == "specialnames"  # the longest pydoc topic
    lengths = [len(text) for _, text in docs]
    assert lengths == sorted(lengths, reverse=True)
    assert len(docs) >= 10
    titles = {t for t, _ in docs}
    assert titles <= set(D.HELD_OUT_TITLES)
    assert not titles & {t for t, _ in D.training_topics()}
    assert [t for t, _ in D.training_topics()] == sorted(t for t, _ in D.training_topics())
    assert D.retrieval_lines(5) == D.retrieval_lines(5)


def test_held_out_text_never_in_training_texts():
    texts = [text for part in D.training_corpus().values() for text in part]
    assert len(texts) > 1000
    topics = D.pydoc_topics()
    train_lines = set()
    for text in texts:
        train_lines |= {line.strip() for line in text.splitlines() if len(line.strip()) >= 12}
    joined = "\n".join(texts)
    for title in D.HELD_OUT_TITLES:
        if title not in topics:
            continue
        held = topics[title]
        assert held not in joined, title
        lines = {line.strip() for line in held.splitlines() if len(line.strip()) >= 12}
        assert not lines & train_lines, (title, sorted(lines & train_lines)[:3])
    # whitespace-insensitive: an 80-character slice of every long paragraph of the evaluation documents is absent
    flat = " ".join(joined.split())
    for title, held in D.held_out_documents()[:3]:
        for para in held.split("\n\n"):
            para = " ".join(para.split())
            if len(para) >= 300:
                assert para[100:180] not in flat, (title, para[100:180])
