"""The tiny random Llama and the offline tokenizer the tests build (conftest.py's fixtures use them too)."""

TINY = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)


def tiny_llama(rope_parameters=None, seed=0, **overrides):
    """A tiny random Llama built from a config: no download. Trained length L = 64."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        **{**TINY, **overrides}, rope_parameters=rope_parameters or {"rope_type": "default", "rope_theta": 10000.0}
    )
    return LlamaForCausalLM(cfg).eval()


def tiny_neox():
    """Partial rotary: 8 of 16 dims per head rotate (rotary_pct 0.5). (The tiny Llama has 4 heads on 2 key heads.)"""
    import torch
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(0)
    return GPTNeoXForCausalLM(
        GPTNeoXConfig(
            vocab_size=128,
            hidden_size=64,
            num_attention_heads=4,
            num_hidden_layers=2,
            intermediate_size=128,
            max_position_embeddings=64,
            rotary_pct=0.5,
        )
    ).eval()


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
