"""Fixtures every test folder sees: an isolated cache, a tiny random Llama, a saved tiny model, texts."""

import logging

import pytest
from helpers import build_tokenizer, tiny_llama

# torch and transformers load in the fixtures that use them, so that tests/test_layers.py (pure AST) runs anywhere
logging.getLogger("transformers").setLevel(logging.ERROR)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    """Tests never write to the real user cache."""
    monkeypatch.setenv("CTXEVAL_CACHE", str(tmp_path / "ctxeval-cache"))


@pytest.fixture
def llama():
    return tiny_llama()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A saved tiny random Llama (L = 64) with a real tokenizer: loadable by --model DIR."""
    path = tmp_path_factory.mktemp("tiny-model")
    tok = build_tokenizer()
    model = tiny_llama(vocab_size=len(tok))
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def text_dir(tmp_path_factory):
    """Small text fixtures written by the tests: three documents of different lengths."""
    from pydoc_data.topics import topics

    path = tmp_path_factory.mktemp("texts")
    names = sorted(topics, key=lambda k: -len(topics[k]))
    (path / "a_long.txt").write_text(topics[names[0]])
    (path / "b_medium.txt").write_text(topics[names[5]][:6000])
    (path / "c_short.txt").write_text("Only a few words here.")
    return path
