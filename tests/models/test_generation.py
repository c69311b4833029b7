"""models/generation.py: stop ids and greedy decoding."""

from ctxeval.models import generation as G


class _Tok:
    def __init__(self, eos, pad=None):
        self.eos_token_id, self.pad_token_id = eos, pad


class _Model:
    def __init__(self, eos):
        self.generation_config = type("G", (), {"eos_token_id": eos})()


def test_every_stop_id_once_tokenizer_first():
    assert G.stop_ids(_Tok(2), _Model([128001, 2, 128009])) == [2, 128001, 128009]
    assert G.stop_ids(_Tok(2), _Model(7)) == [2, 7]
    assert G.stop_ids(_Tok(None), _Model(None)) == [] and G.stop_ids(_Tok(5)) == [5]


def test_greedy_decoding_ignores_the_checkpoints_own_settings():
    cfg = G.greedy_config(_Tok(2), 12, _Model([2, 9]))
    assert (cfg.do_sample, cfg.num_beams, cfg.max_new_tokens, cfg.pad_token_id, cfg.eos_token_id) == (
        False,
        1,
        12,
        2,
        [2, 9],
    )  # no pad token: the first stop id pads
    assert G.greedy_config(_Tok(2, pad=0), 5, _Model(None)).pad_token_id == 0
    empty = G.greedy_config(_Tok(None), 5)
    assert empty.pad_token_id is None and empty.eos_token_id is None
    assert cfg.repetition_penalty in (None, 1.0) and cfg.no_repeat_ngram_size in (
        None,
        0,
    )  # fresh, not the checkpoint's
