import logging

import pytest

# torch and transformers load in the fixtures that use them, so that tests/test_layers.py (pure AST) runs anywhere
logging.getLogger("transformers").setLevel(logging.ERROR)

TINY = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    """Tests never write to the real user cache."""
    monkeypatch.setenv("CTXEVAL_CACHE", str(tmp_path / "ctxeval-cache"))


def tiny_llama(rope_parameters=None, seed=0, **overrides):
    """A tiny random Llama built from a config: no download. Trained length L = 64."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        **{**TINY, **overrides}, rope_parameters=rope_parameters or {"rope_type": "default", "rope_theta": 10000.0}
    )
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture
def llama():
    return tiny_llama()


def build_tokenizer(vocab_size=300):
    """A small byte-level BPE tokenizer trained offline on CPython's bundled docs (no download)."""
    from pydoc_data.topics import topics

    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(
        list(topics.values()),
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=["<s>", "</s>"],
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok._tokenizer, bos_token="<s>", eos_token="</s>")


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
