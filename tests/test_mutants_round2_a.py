"""Issue 27, mutmut round 2 (positions, key_tokens, entropy, attention): behaviours the surviving mutants showed
untested. Each test names the behaviour it pins; docs/testing.md lists the mutants each one kills."""

from __future__ import annotations

import numpy as np
import pytest

from ctxeval.errors import CtxevalError
from ctxeval.evals.positions import MAX_BUCKETS, default_edges, key_sums, parse_position_buckets

# ------------------------------------------------------------------------------------------------ positions.py


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


# ----------------------------------------------------------------------------------------------- key_tokens.py


class _Tokenizer:
    """A tokenizer's surface as key_tokens reads it: vocabulary, BOS id, ids with and without default specials."""

    def __init__(self, vocab_size=50, bos=1, prefix=(1,)):
        self.vocab, self.bos_token_id, self.prefix = {f"t{i}": i for i in range(vocab_size)}, bos, list(prefix)

    def get_vocab(self):
        return dict(self.vocab)

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": (self.prefix if add_special_tokens else []) + [ord(c) % 40 + 5 for c in text]}


def test_a_tokenizer_is_the_same_as_itself_and_as_an_equal_copy():
    from ctxeval.evals.key_tokens import same_tokenizer

    tok = _Tokenizer()
    assert same_tokenizer(tok, tok) is True
    assert same_tokenizer(_Tokenizer(), _Tokenizer()) is True
    a, b = _Tokenizer(), _Tokenizer()
    del a.bos_token_id, b.bos_token_id  # a tokenizer without the attribute at all
    assert same_tokenizer(a, b) is True and same_tokenizer(a, _Tokenizer(bos=None)) is True


@pytest.mark.parametrize(
    "other",
    [
        _Tokenizer(vocab_size=51),
        _Tokenizer(bos=2),
        _Tokenizer(bos=None),
        _Tokenizer(prefix=()),
        _Tokenizer(prefix=(1, 2)),
    ],
    ids=["vocabulary", "bos", "no-bos", "no-prefix", "longer-prefix"],
)
def test_tokenizers_differing_in_one_respect_are_not_the_same(other):
    from ctxeval.evals.key_tokens import same_tokenizer

    assert same_tokenizer(_Tokenizer(), other) is False
    assert same_tokenizer(other, _Tokenizer()) is False


@pytest.mark.parametrize(
    "bos, prefix, candidates", [(False, (), 12), (False, (7, 8), 14), (True, (), 11), (True, (7, 8), 13)]
)
def test_summary_counts_the_evaluators_candidate_tokens(bos, prefix, candidates):
    """The evaluator reads its prefix + the document without the evaluated model's BOS: a 20-token sequence with
    context 8 leaves 20 - bos + len(prefix) - 8 tokens that can be key tokens."""
    from ctxeval.evals.key_tokens import CACHE_FILE, KeyTokenSettings, summary

    settings = KeyTokenSettings("ev", "none", 8, 2, prefix, bos)
    found = {"a": np.array([9, 12, 15]), "b": np.zeros(0, dtype=np.int64)}
    out = summary(settings, found, {"a": 20, "b": 8 - len(prefix) + bos})
    assert out["file"] == CACHE_FILE and out["evaluator"] == "ev" and out["context"] == 8
    assert out["documents"] == [
        {"doc": "a", "key_tokens": 3, "candidates": candidates, "fraction": round(3 / candidates, 6)},
        {"doc": "b", "key_tokens": 0, "candidates": 0, "fraction": None},
    ]


def _settings(**kw):
    from ctxeval.evals.key_tokens import KeyTokenSettings

    return KeyTokenSettings(
        **{
            "evaluator": "ev",
            "method": "yarn(factor=2)",
            "context": 8,
            "window": 2,
            "evaluator_prefix": (1,),
            "bos": False,
            **kw,
        }
    )


def _cache(path, settings, documents):
    import json

    path.write_text(json.dumps({"settings": settings.record(), "documents": documents}) + "\n")
    return path


def test_a_cache_of_these_settings_and_documents_is_read_back(tmp_path):
    from ctxeval.evals.key_tokens import read_cache

    path = _cache(
        tmp_path / "k.json",
        _settings(),
        {
            "a": {"sequence_tokens": 20, "positions": [1, 5, 19]},
            "b": {"sequence_tokens": 12, "positions": []},
            "c": {"sequence_tokens": 30, "positions": [3.0, 4]},
        },
    )
    got = read_cache(path, _settings(), {"a": 20, "b": 12, "c": 30})
    assert {k: (v.tolist(), v.dtype) for k, v in got.items()} == {
        "a": ([1, 5, 19], np.int64),
        "b": ([], np.int64),
        "c": ([3, 4], np.int64),
    }
    assert list(read_cache(path, _settings(), {"b": 12})) == ["b"]  # documents the run does not read are left


@pytest.mark.parametrize(
    "entry",
    [
        {"sequence_tokens": 21, "positions": [1, 5]},  # another length
        {"positions": [1, 5]},
        {"sequence_tokens": 20, "positions": "1,5"},
        {"sequence_tokens": 20},
        {"sequence_tokens": 20, "positions": [0, 5]},  # position 0 has no loss
        {"sequence_tokens": 20, "positions": [5, 20]},  # past the sequence
        {"sequence_tokens": 20, "positions": [5, 5]},  # not increasing
        {"sequence_tokens": 20, "positions": [6, 5]},
        {"sequence_tokens": 20, "positions": [1.5]},
        {"sequence_tokens": 20, "positions": ["3"]},
        {"sequence_tokens": 20, "positions": [True]},
        [1, 5],
    ],
    ids=lambda e: str(e),
)
def test_a_cache_entry_that_does_not_fit_the_document_is_stale(tmp_path, entry):
    from ctxeval.evals.key_tokens import read_cache

    path = _cache(tmp_path / "k.json", _settings(), {"a": entry, "b": {"sequence_tokens": 12, "positions": [2]}})
    assert read_cache(path, _settings(), {"a": 20, "b": 12}) is None
    assert read_cache(path, _settings(), {"b": 12})["b"].tolist() == [2]  # the other document alone is fine


@pytest.mark.parametrize(
    "change",
    [
        dict(evaluator="other"),
        dict(context=9),
        dict(window=3),
        dict(bos=True),
        dict(evaluator_prefix=()),
        dict(alpha=2.5),
        dict(beta=1.0),
    ],
)
def test_a_cache_of_other_settings_is_stale(tmp_path, change):
    from ctxeval.evals.key_tokens import read_cache

    path = _cache(tmp_path / "k.json", _settings(**change), {"a": {"sequence_tokens": 20, "positions": [3]}})
    assert read_cache(path, _settings(), {"a": 20}) is None
    assert read_cache(path, _settings(**change), {"a": 20})["a"].tolist() == [3]


@pytest.mark.parametrize("text", ["", "not json", "[1, 2]", '{"documents": {}}', "null"])
def test_a_cache_file_that_is_not_a_key_token_file_is_stale(tmp_path, text):
    import json

    from ctxeval.evals.key_tokens import read_cache

    path = tmp_path / "k.json"
    path.write_text(text)
    assert read_cache(path, _settings(), {"a": 20}) is None
    assert read_cache(tmp_path / "missing.json", _settings(), {"a": 20}) is None
    path.write_text(json.dumps({"settings": _settings().record(), "documents": [1]}))
    assert read_cache(path, _settings(), {"a": 20}) is None


def test_default_context_is_the_papers_4096_only_past_it():
    from ctxeval.evals.key_tokens import default_context, default_window

    assert default_context(2048, 8192) == 4096 and default_context(100, 4097) == 4096
    assert default_context(8192, 4096) == 2048  # a longest length of exactly 4096: half of it
    assert default_context(128, 1024) == 64 and default_context(4, 4) == 2 and default_context(2, 64) == 2
    assert default_window(4096) == 1024 and default_window(64) == 16 and default_window(3) == 1


def test_the_settings_record_is_what_run_json_and_the_cache_hold():
    s = _settings(evaluator_prefix=(1, 5), bos=True, alpha=1.5)
    assert s.record() == {
        "evaluator": "ev",
        "method": "yarn(factor=2)",
        "context": 8,
        "window": 2,
        "evaluator_prefix": [1, 5],
        "bos": True,
        "alpha": 1.5,
        "beta": 2.0,
        "rule": "LongPPL find_key_token: short loss - long loss > alpha and long loss < beta",
    }


def test_the_truncate_sequence_is_bos_and_the_documents_first_tokens():
    from ctxeval.data.corpora import TokenDoc
    from ctxeval.evals.key_tokens import document_sequence

    doc = TokenDoc("d", np.arange(100, 130))
    assert document_sequence(doc, 10, 7) == [7] + list(range(100, 109))
    assert document_sequence(doc, 10, 0) == [0] + list(range(100, 109))  # BOS id 0 is a BOS
    assert document_sequence(doc, 10, None) == list(range(100, 110))
    assert document_sequence(doc, 50, None) == list(range(100, 130))  # a shorter document: all of it


class _Store:
    def __init__(self, path):
        self.dir, self.updates = path, []

    def update(self, **fields):
        self.updates.append(fields)


def _find(tmp_path, monkeypatch, bos, spec="none", found=None, load=None, shipped=None):
    """find_key_tokens with the evaluator's forward replaced: it records the document each call is given."""
    import contextlib
    from types import SimpleNamespace

    from ctxeval.data.corpora import TokenDoc
    from ctxeval.evals import key_tokens as K
    from ctxeval.specs import expand_specs

    seen, events = [], []

    @contextlib.contextmanager
    def applying(lm, method, lengths):
        events.append(("apply", method.label, lengths))
        yield None, {}

    def keys(model, device, document, settings, chunk_size):
        seen.append((model, device, list(document), chunk_size))
        return np.array([2, len(document) - 1], dtype=np.int64)

    monkeypatch.setattr(K, "applying", applying)
    monkeypatch.setattr(K, "evaluator_keys", keys)
    lm = SimpleNamespace(
        model="evaluator-model",
        device="cpu",
        rope=None if shipped is None else SimpleNamespace(shipped={"rope_type": shipped}),
    )

    def load_evaluator():
        events.append("load")
        return lm, lambda: events.append("release")

    docs = [TokenDoc("a", np.arange(100, 140)), TokenDoc("b", np.arange(200, 230))]
    store = _Store(tmp_path)
    settings = _settings(bos=bos is not None, context=4)
    notes = SimpleNamespace(note=lambda text: events.append(("note", text)))
    got = K.find_key_tokens(
        store, settings, load or load_evaluator, expand_specs([spec])[0], docs, 16, bos, chunk_size=8, progress=notes
    )
    return got, seen, events, store, settings


@pytest.mark.parametrize("bos", [None, 9])
def test_the_evaluator_reads_each_document_without_the_evaluated_models_bos(tmp_path, monkeypatch, bos):
    import json

    from ctxeval.evals.key_tokens import CACHE_FILE, read_cache, summary

    got, seen, events, store, settings = _find(tmp_path, monkeypatch, bos)
    n = 15 if bos is not None else 16  # document tokens in a 16-token sequence
    assert seen == [
        ("evaluator-model", "cpu", list(range(100, 100 + n)), 8),
        ("evaluator-model", "cpu", list(range(200, 200 + n)), 8),
    ]
    assert events == [
        "load",
        ("apply", "none", (16,)),
        ("note", "key tokens: ev under none on a"),
        ("note", "key tokens: ev under none on b"),
        "release",
    ]
    assert {k: v.tolist() for k, v in got.items()} == {"a": [2, n - 1], "b": [2, n - 1]}
    assert (tmp_path / CACHE_FILE).read_text().count("\n") == 1
    cache = json.loads((tmp_path / CACHE_FILE).read_text())
    assert cache["documents"] == {d: {"sequence_tokens": 16, "positions": [2, n - 1]} for d in ("a", "b")}
    assert {k: v.tolist() for k, v in read_cache(tmp_path / CACHE_FILE, settings, {"a": 16, "b": 16}).items()} == {
        "a": [2, n - 1],
        "b": [2, n - 1],
    }
    assert store.updates == [{"key_tokens": summary(settings, got, {"a": 16, "b": 16})}]
    # a second run reads the file: no evaluator is loaded
    again, seen2, events2, store2, _ = _find(
        tmp_path, monkeypatch, bos, load=lambda: (_ for _ in ()).throw(AssertionError("loaded again"))
    )
    assert (
        seen2 == []
        and events2 == []
        and {k: v.tolist() for k, v in again.items()} == {k: v.tolist() for k, v in got.items()}
    )
    assert store2.updates == store.updates


@pytest.mark.parametrize("spec, shipped", [("dynamic-ntk", None), ("native", "dynamic"), ("native", "longrope")])
def test_a_length_dependent_evaluator_method_is_refused_and_the_evaluator_released(
    tmp_path, monkeypatch, spec, shipped
):
    from types import SimpleNamespace

    from ctxeval.evals.key_tokens import CACHE_FILE

    events = []
    rope = None if shipped is None else SimpleNamespace(shipped={"rope_type": shipped})
    with pytest.raises(
        CtxevalError,
        match=rf"^--key-tokens-method {spec} depends on the sequence length; key tokens "
        r"are found once per document: give a static method \(e\.g\. "
        r"yarn:factor=2\)$",
    ):
        _find(
            tmp_path,
            monkeypatch,
            None,
            spec=spec,
            load=lambda: (
                events.append("load")
                or (SimpleNamespace(model=None, device="cpu", rope=rope), lambda: events.append("release"))
            ),
        )
    assert events == ["load", "release"] and not (tmp_path / CACHE_FILE).exists()


def test_native_without_a_shipped_dynamic_rope_finds_key_tokens(tmp_path, monkeypatch):
    got, seen, events, _, _ = _find(tmp_path, monkeypatch, None, spec="native", shipped="yarn")
    assert len(seen) == 2 and events[1] == ("apply", "native", (16,))


def test_settings_bos_must_match_the_sequences(tmp_path, monkeypatch):
    from ctxeval.evals.key_tokens import find_key_tokens
    from ctxeval.specs import expand_specs

    with pytest.raises(ValueError, match="KeyTokenSettings.bos is True but the sequences' BOS id is None"):
        find_key_tokens(_Store(tmp_path), _settings(bos=True), None, expand_specs(["none"])[0], [], 16, None, 8)
    with pytest.raises(ValueError, match="KeyTokenSettings.bos is False but the sequences' BOS id is 0"):
        find_key_tokens(_Store(tmp_path), _settings(bos=False), None, expand_specs(["none"])[0], [], 16, 0, 8)


def test_another_rank_reads_the_main_ranks_file_and_refuses_a_missing_one(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from ctxeval.evals import key_tokens as K

    got, *_ = _find(tmp_path, monkeypatch, None)  # the main rank writes key-tokens.json
    barriers = []
    monkeypatch.setattr(K, "current", lambda: SimpleNamespace(is_main=False, barrier=lambda: barriers.append(1)))
    store = _Store(tmp_path)
    settings = _settings(context=4)
    docs = [K.TokenDoc("a", np.arange(100, 140)), K.TokenDoc("b", np.arange(200, 230))]
    spec = __import__("ctxeval.specs", fromlist=["x"]).expand_specs(["none"])[0]
    never = lambda: (_ for _ in ()).throw(AssertionError("another rank loads no evaluator"))  # noqa: E731
    mine = K.find_key_tokens(store, settings, never, spec, docs, 16, None, 8)
    assert {k: v.tolist() for k, v in mine.items()} == {k: v.tolist() for k, v in got.items()}
    assert store.updates == [] and barriers == [1]
    (tmp_path / K.CACHE_FILE).unlink()
    with pytest.raises(CtxevalError, match=r"key-tokens\.json is missing or stale on this rank; run the command again"):
        K.find_key_tokens(store, settings, never, spec, docs, 16, None, 8)


def test_a_non_finite_value_in_a_document_the_run_does_not_read_leaves_the_cache_usable(tmp_path):
    from ctxeval.evals.key_tokens import read_cache

    path = _cache(
        tmp_path / "k.json",
        _settings(),
        {"a": {"sequence_tokens": 20, "positions": [3]}, "other": {"sequence_tokens": 20, "positions": [float("nan")]}},
    )
    assert "NaN" in path.read_text()
    assert read_cache(path, _settings(), {"a": 20})["a"].tolist() == [3]
    assert read_cache(path, _settings(), {"a": 20, "other": 20}) is None


@pytest.mark.parametrize(
    "change, fragment",
    [
        (
            dict(protocol="sliding"),
            r"^--key-tokens \(LongPPL\) scores one long context per document: use --protocol truncate$",
        ),
        (
            dict(context=0),
            r"^--key-tokens-context must be at least 1 token \(its stride a quarter of it, at least 1\), got 0$",
        ),
        (dict(window=0), r"^--key-tokens-context must be at least 1 token .*, got 8$"),
        (
            dict(context=64),
            r"^--key-tokens-context 64 is not shorter than the longest length 64: no token would have more "
            r"than the short context; use a smaller --key-tokens-context or longer --lengths$",
        ),
        (dict(context=100), r"^--key-tokens-context 100 is not shorter than the longest length 64"),
    ],
)
def test_key_token_settings_are_checked(change, fragment):
    from ctxeval.evals.key_tokens import check_settings

    protocol = change.pop("protocol", "truncate")
    with pytest.raises(CtxevalError, match=fragment):
        check_settings(_settings(**change), (32, 64, 16), protocol)


def test_key_token_settings_at_the_limits_are_accepted():
    from ctxeval.evals.key_tokens import check_settings

    check_settings(_settings(context=63, window=1), (32, 64, 16), "truncate")
    check_settings(_settings(context=1, window=1), (2,), "truncate")


class _Wrapping(_Tokenizer):
    """Adds `before` and `after` around a text's ids by default (BOS, EOS)."""

    def __init__(self, before, after, merge=False):
        super().__init__(prefix=before)
        self.after, self.merge = list(after), merge

    def __call__(self, text, add_special_tokens=True):
        ids = super().__call__(text, add_special_tokens)["input_ids"]
        if add_special_tokens and self.merge:
            ids = ids[: len(self.prefix)] + [99] + ids[len(self.prefix) + 2 :]  # the first two text tokens as one
        return {"input_ids": ids + (self.after if add_special_tokens else [])}


@pytest.mark.parametrize("before, after", [((), ()), ((), (2,)), ((1,), ()), ((1,), (2,)), ((1, 3), (2, 2))])
def test_special_prefix_is_what_comes_before_the_texts_own_tokens(before, after):
    from ctxeval.evals.key_tokens import special_prefix

    assert special_prefix(_Wrapping(before, after)) == tuple(before)


@pytest.mark.parametrize("before, after", [((), ()), ((1,), (2,))])
def test_a_tokenizer_that_changes_the_texts_tokens_is_refused(before, after):
    from ctxeval.evals.key_tokens import special_prefix

    with pytest.raises(
        CtxevalError,
        match=r"^the tokenizer's default special tokens change the text's own tokens; "
        r"LongPPL's key tokens cannot be placed: use an evaluator whose tokenizer "
        r"only adds tokens around the text$",
    ):
        special_prefix(_Wrapping(before, after, merge=True))


# ------------------------------------------------------------------------------------------------- entropy.py


def _reference_entropy(query, key, heads, scale, allowed=None, additive=None):
    """Per query: mean over `heads` of -sum p ln p, p = causal softmax(q k^T * scale) (float64, one head at a time)."""
    import torch

    n_heads, n = query.shape[1], query.shape[2]
    group = n_heads // key.shape[1]
    out = torch.zeros(n, dtype=torch.float64)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    for h in heads:
        z = query[0, h].double() @ key[0, h // group].double().T * scale
        if additive is not None:
            z = z + additive.double()
        ok = causal & (allowed if allowed is not None else True)
        p = torch.softmax(z.masked_fill(~ok, float("-inf")), -1)
        out += -(p * torch.where(p > 0, p.log(), torch.zeros_like(p))).sum(-1)
    return out / len(heads)


def _qk(n=9, heads=4, kv=2, dim=8, seed=0):
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, heads, n, dim, generator=g), torch.randn(1, kv, n, dim, generator=g)


def test_entropy_settings_are_checked():
    from ctxeval.evals.entropy import EntropyConfig

    for lengths in ((), (1,), (64, 1)):
        with pytest.raises(CtxevalError, match=r"^--lengths must be >= 2 tokens$"):
            EntropyConfig(lengths)
    with pytest.raises(CtxevalError, match=r"^--query-chunk must be >= 1, got 0$"):
        EntropyConfig((8,), query_chunk=0)
    cfg = EntropyConfig((2,), query_chunk=1)
    assert (cfg.layers, cfg.heads, cfg.chunk_bytes, cfg.bos) == (None, None, 2**31, True)
    assert EntropyConfig((8,)).query_chunk == 512


@pytest.mark.parametrize("heads, chunk", [(None, 4), ((1, 2), 3), ((3,), 100), ((0, 1, 2, 3), 1)])
def test_observe_equals_the_per_head_formula_with_grouped_keys(heads, chunk):
    from types import SimpleNamespace

    from ctxeval.evals.entropy import EntropyCapture

    q, k = _qk()
    cap = EntropyCapture(None, heads, chunk)
    cap.observe(SimpleNamespace(layer_idx=3), q, k, None, 0.5, {})
    want = _reference_entropy(q, k, heads or range(4), 0.5)
    assert list(cap.per_layer) == [3] and cap.per_layer[3].dtype == want.dtype
    assert torch_close(cap.per_layer[3], want)


def torch_close(a, b, tol=1e-5):
    return float((a.double() - b.double()).abs().max()) < tol


def test_observe_without_a_scaling_uses_one_over_the_root_of_the_head_dimension():
    from types import SimpleNamespace

    from ctxeval.evals.entropy import EntropyCapture

    q, k = _qk(dim=16)
    cap = EntropyCapture(None, None, 5)
    cap.observe(SimpleNamespace(layer_idx=0), q, k, None, None, {})
    assert torch_close(cap.per_layer[0], _reference_entropy(q, k, range(4), 0.25))
    assert not torch_close(cap.per_layer[0], _reference_entropy(q, k, range(4), 1.0))


@pytest.mark.parametrize("kind", ["bool4", "float4", "float3", "bool3", "bool4h", "float4h"])
def test_observe_applies_the_modules_mask(kind):
    """A sliding window of 3 keys as the module's mask (bool, or additive -inf), 4-D or without the batch axis, one
    for all heads or one per head of a key/value group (4h)."""
    from types import SimpleNamespace

    import torch

    from ctxeval.evals.entropy import EntropyCapture

    n = 9
    q, k = _qk(n=n)
    i = torch.arange(n)
    window = i[None, :] > i[:, None] - 3  # key j within 3 of query i (the causal part is the capture's own)
    mask = window if kind.startswith("bool") else torch.zeros(n, n).masked_fill(~window, float("-inf"))
    mask = (
        mask[None, None]
        if kind.endswith("4")
        else mask[None, None].expand(1, 2, n, n)
        if kind.endswith("4h")
        else mask[None]
    )
    cap = EntropyCapture(None, None, 4)
    cap.observe(SimpleNamespace(layer_idx=0), q, k, mask, 0.5, {})
    want = _reference_entropy(q, k, range(4), 0.5, allowed=window)
    assert torch_close(cap.per_layer[0], want)
    assert float(cap.per_layer[0][-1]) <= np.log(3) + 1e-6  # three keys at most


def test_observe_counts_layers_without_an_index_and_keeps_only_the_sampled_ones():
    from types import SimpleNamespace

    from ctxeval.evals.entropy import EntropyCapture

    q, k = _qk()
    cap = EntropyCapture({1, 2}, None, 4)
    for _ in range(4):
        cap.observe(SimpleNamespace(), q, k, None, 0.5, {})  # no layer_idx: the call's order
    assert sorted(cap.per_layer) == [1, 2] and cap.counter == 4
    cap.reset()
    assert cap.per_layer == {} and cap.counter == 0
    cap.observe(SimpleNamespace(layer_idx=None), q, k, None, 0.5, {})
    cap.observe(SimpleNamespace(layer_idx=2), q, k, None, 0.5, {})
    assert list(cap.per_layer) == [2] and cap.counter == 2


def test_observe_refuses_what_it_does_not_model():
    from types import SimpleNamespace

    import torch

    from ctxeval.evals.entropy import EntropyCapture

    q, k = _qk()
    cap = EntropyCapture(None, None, 4)
    for module, kwargs in (
        (SimpleNamespace(layer_idx=0), {"softcap": 50.0}),
        (SimpleNamespace(layer_idx=0, sinks=1), {}),
    ):
        with pytest.raises(
            CtxevalError,
            match=r"^entropy: this model's attention uses logit soft-capping or sinks, "
            r"which the entropy measurement does not model$",
        ):
            cap.observe(module, q, k, None, 0.5, kwargs)
    cap.observe(SimpleNamespace(layer_idx=0, sinks=None), q, k, None, 0.5, {"softcap": None})  # absent: fine
    one = r"^entropy measures one full-sequence forward at a time \(batch 1, no cache\)$"
    with pytest.raises(CtxevalError, match=one):
        cap.observe(SimpleNamespace(layer_idx=0), torch.cat((q, q)), torch.cat((k, k)), None, 0.5, {})
    with pytest.raises(CtxevalError, match=one):
        cap.observe(SimpleNamespace(layer_idx=0), q[:, :, -1:], k, None, 0.5, {})
    with pytest.raises(CtxevalError, match=r"^--heads 4 is out of range: the model has 4 query heads$"):
        EntropyCapture(None, (0, 4), 4).observe(SimpleNamespace(layer_idx=0), q, k, None, 0.5, {})


def _runner(bos=True, bos_id=1, progress=None, heads=None):
    from conftest import tiny_llama

    from ctxeval.evals.entropy import EntropyConfig, EntropyRunner

    model = tiny_llama(num_hidden_layers=2, attn_implementation="sdpa")
    cfg = EntropyConfig((8, 16), heads=heads, bos=bos)
    return EntropyRunner(model, "cpu", cfg, bos_id, "tiny", progress), cfg


def test_the_entropy_sequence_is_bos_and_the_documents_first_tokens():
    from ctxeval.data.corpora import TokenDoc

    doc = TokenDoc("d", np.arange(10, 40))
    with_bos, _ = _runner()
    assert with_bos._ids(doc, 8).tolist() == [[1, 10, 11, 12, 13, 14, 15, 16]]
    assert _runner(bos_id=0)[0]._ids(doc, 4).tolist() == [[0, 10, 11, 12]]  # BOS id 0 is a BOS
    assert _runner(bos_id=None)[0]._ids(doc, 4).tolist() == [[10, 11, 12, 13]]
    assert _runner(bos=False)[0]._ids(doc, 4).tolist() == [[10, 11, 12, 13]]


def test_an_entropy_row_holds_the_per_layer_means_over_its_length():
    import torch

    from ctxeval.data.corpora import TokenDoc
    from ctxeval.runs.rows import uniform_entropy
    from ctxeval.specs import expand_specs

    runner, _ = _runner(heads=(0, 3))
    per_layer = {1: torch.arange(16, dtype=torch.float64), 0: torch.ones(16, dtype=torch.float64)}
    spec = expand_specs(["yarn:factor=2"])[0]
    row = runner._row(spec, TokenDoc("d", np.arange(20)), 8, per_layer, 1.25)
    assert {
        k: row[k]
        for k in (
            "model",
            "label",
            "task",
            "metric",
            "length",
            "doc",
            "layers",
            "entropy_per_layer",
            "entropy",
            "value",
            "uniform_entropy",
            "heads",
            "seconds",
            "status",
        )
    } == {
        "model": "tiny",
        "label": "yarn(factor=2)",
        "task": "entropy",
        "metric": row["metric"],
        "length": 8,
        "doc": "d",
        "layers": [0, 1],
        "entropy_per_layer": [1.0, 3.5],
        "entropy": 2.25,
        "value": 2.25,
        "uniform_entropy": uniform_entropy(8),
        "heads": [0, 3],
        "seconds": 1.25,
        "status": "ok",
    }
    assert _runner()[0]._row(spec, TokenDoc("d", np.arange(20)), 8, per_layer, 1.0)["heads"] == "all"


class _Notes:
    def __init__(self):
        self.events = []

    def note(self, text):
        self.events.append(("note", text))

    def advance(self, amount, text):
        self.events.append(("advance", amount, text))

    def start(self, total):
        self.events.append(("start", total))


def _out_of_memory_at(runner, failing: int) -> list[int]:
    """Make the runner's forward run out of memory at one length; returns the lengths it is called with."""
    from ctxeval.evals.common import PointOOM

    calls, real = [], runner._forward

    def forward(cap, doc, length):
        calls.append(length)
        if length == failing:
            raise PointOOM("out of memory (injected)")
        return real(cap, doc, length)

    runner._forward = forward
    return calls


def test_a_length_dependent_method_runs_one_forward_per_length_and_an_oom_ends_in_a_row():
    from ctxeval.data.corpora import TokenDoc
    from ctxeval.evals.entropy import capture
    from ctxeval.specs import expand_specs

    notes = _Notes()
    runner, cfg = _runner(progress=notes)
    calls = _out_of_memory_at(runner, 16)
    rows, spec = [], expand_specs(["dynamic-ntk"])[0]
    with capture(runner.model, cfg) as cap:
        runner.measure(spec, TokenDoc("d", np.arange(5, 45)), [24, 16, 8], cap, rows.extend, static=False)
    assert calls == [8, 16, 24]  # the length after the one that ran out of memory is still measured
    assert [(r["length"], r["status"]) for r in rows] == [(8, "ok"), (16, "oom"), (24, "ok")]
    assert {k: rows[1][k] for k in ("model", "label", "task", "doc", "note", "value")} == {
        "model": "tiny",
        "label": "dynamic-ntk",
        "task": "entropy",
        "doc": "d",
        "note": "out of memory (injected)",
        "value": None,
    }
    assert notes.events == [
        ("advance", 8, "dynamic-ntk d L=8"),
        ("note", "dynamic-ntk: out of memory at 16 tokens"),
        ("advance", 24, "dynamic-ntk d L=24"),
    ]


def test_a_static_method_that_runs_out_of_memory_says_so_and_measures_length_by_length():
    from ctxeval.data.corpora import TokenDoc
    from ctxeval.evals.entropy import capture
    from ctxeval.specs import expand_specs

    notes = _Notes()
    runner, cfg = _runner(progress=notes)
    calls = _out_of_memory_at(runner, 16)
    rows = []
    with capture(runner.model, cfg) as cap:
        runner.measure(expand_specs(["none"])[0], TokenDoc("d", np.arange(5, 45)), [16, 8], cap, rows.extend)
    assert calls == [16, 8, 16]
    assert [(r["length"], r["status"]) for r in rows] == [(8, "ok"), (16, "oom")]
    assert notes.events == [
        ("note", "none: out of memory at 16 tokens; measuring length by length"),
        ("advance", 8, "none d L=8"),
        ("note", "none: out of memory at 16 tokens"),
    ]


def test_a_static_method_measures_every_length_in_one_forward():
    from ctxeval.data.corpora import TokenDoc
    from ctxeval.evals.entropy import capture
    from ctxeval.specs import expand_specs

    notes = _Notes()
    runner, cfg = _runner(progress=notes)
    calls, real = [], runner._forward
    runner._forward = lambda cap, doc, length: calls.append(length) or real(cap, doc, length)
    rows = []
    with capture(runner.model, cfg) as cap:
        runner.measure(expand_specs(["none"])[0], TokenDoc("d", np.arange(5, 45)), [16, 8], cap, rows.extend)
    assert calls == [16] and [r["length"] for r in rows] == [8, 16]
    assert 0 < rows[0]["seconds"] == rows[1]["seconds"] < 60
    assert notes.events == [("advance", 16, "none d L=16")]


def test_layers_are_checked_against_the_models():
    from ctxeval.evals.entropy import check_layers

    check_layers(2, None)
    check_layers(2, (0, 1))
    for layers in ((2,), (-1,), (0, 2)):
        with pytest.raises(CtxevalError, match=rf"^--layers must be in 0\.\.1, got {','.join(map(str, layers))}$"):
            check_layers(2, layers)


# ------------------------------------------------------------------------------------------ attention/methods.py


def _att(name, **given):
    from ctxeval.attention.methods import resolve_attention

    return resolve_attention(name, given)


def test_an_unknown_attention_method_names_the_known_ones():
    from ctxeval.attention.methods import ATTENTION_METHODS, get_attention_method

    with pytest.raises(
        CtxevalError,
        match=r"^unknown attention method 'yarn'; choose one of: self-extend, rerope, "
        r"leaky-rerope, logn$",
    ):
        get_attention_method("yarn")
    assert get_attention_method("rerope") is ATTENTION_METHODS["rerope"]
    assert [m.remaps for m in ATTENTION_METHODS.values()] == [True, True, True, False]


def test_attention_parameters_are_typed_and_defaults_filled():
    assert (_att("self-extend").params, _att("self-extend").given) == ({"group_size": 8, "neighbor_window": 1024}, {})
    assert _att("rerope").params == {"window": 512, "logn": True, "length": None}
    assert _att("leaky-rerope").params == {"window": 512, "k": 16.0, "logn": True, "length": None}
    assert _att("logn").params == {"length": None}
    spec = _att("leaky-rerope", window="64", k="4", logn="false")
    assert spec.params == {"window": 64, "k": 4.0, "logn": False, "length": None}
    assert spec.given == {"window": 64, "k": 4.0, "logn": False}
    assert type(spec.params["window"]) is int and type(spec.params["k"]) is float
    assert _att("logn", length=None).params == {"length": None}  # None: the model's trained length
    assert _att("self-extend", group_size=4, neighbor_window=4).params == {"group_size": 4, "neighbor_window": 4}


def test_bad_attention_parameters_are_one_line_errors():
    with pytest.raises(
        CtxevalError,
        match=r"^attention method 'rerope' does not take 'k'; it takes: window, logn, "
        r"length$",
    ):
        _att("rerope", k=2)
    with pytest.raises(
        CtxevalError,
        match=r"^self-extend: neighbor_window \(4\) must be >= group_size \(8\): the "
        r"grouped query position i//G \+ W - W//G assumes W >= G$",
    ):
        _att("self-extend", neighbor_window=4)
    with pytest.raises(CtxevalError, match=r"^self-extend: neighbor_window \(3\) must be >= group_size \(4\)"):
        _att("self-extend", group_size=4, neighbor_window=3)
    with pytest.raises(CtxevalError, match="leaky-rerope: k must be >= 1"):
        _att("leaky-rerope", k=0.5)


def test_attention_combinations():
    from ctxeval.attention.methods import check_combination

    check_combination((_att("self-extend"), _att("logn")))
    check_combination((_att("rerope", logn=False), _att("logn")))
    check_combination((_att("leaky-rerope"),))
    with pytest.raises(
        CtxevalError,
        match=r"^rerope and self-extend both change far pairs' positions; combine at most "
        r"one of self-extend, rerope, leaky-rerope \(with logn and a frequency "
        r"method\)$",
    ):
        check_combination((_att("rerope"), _att("logn"), _att("self-extend")))
    with pytest.raises(CtxevalError, match=r"^attention method given twice: logn\+logn$"):
        check_combination((_att("logn"), _att("logn")))
    with pytest.raises(
        CtxevalError,
        match=r"^leaky-rerope already applies logn \(its logn=true\); drop \+logn or set "
        r"logn=false$",
    ):
        check_combination((_att("leaky-rerope", window=8), _att("logn")))


def test_window_and_logn_length_of_each_method():
    from ctxeval.attention.methods import logn_length, window_of

    assert [
        window_of(s)
        for s in (
            _att("self-extend", neighbor_window=64),
            _att("rerope", window=32),
            _att("leaky-rerope", window=16),
            _att("logn"),
        )
    ] == [64, 32, 16, None]
    assert logn_length(_att("logn"), 4096) == 4096 and logn_length(_att("logn", length=100), 4096) == 100
    assert logn_length(_att("rerope"), 4096) == 4096 and logn_length(_att("rerope", length=8), 4096) == 8
    assert logn_length(_att("rerope", logn=False), 4096) is None
    assert logn_length(_att("self-extend"), 4096) is None


def test_noop_reason_says_why_the_methods_change_nothing():
    from ctxeval.attention.methods import noop_reason

    rerope = _att("rerope", window=512, logn=False)
    assert (
        noop_reason((rerope,), [128, 512], 64)
        == "rerope's window 512 >= the longest length 512: identical to the model without them"
    )
    assert noop_reason((rerope,), [513, 128], 64) is None
    assert noop_reason((_att("logn"),), [32, 64], 64) == "logn is 1 up to L=64: identical to the model without them"
    assert noop_reason((_att("logn"),), [65], 64) is None
    assert (
        noop_reason((_att("rerope", window=600),), [512], 512)
        == "rerope's window 600 >= the longest length 512; logn is 1 up to L=512: identical to the model without them"
    )
    assert noop_reason((_att("rerope", window=600),), [513], 512) is None  # logn scales past L
    assert (
        noop_reason((_att("self-extend", group_size=2, neighbor_window=8), _att("logn", length=8)), [8], 64)
        == "self-extend's window 8 >= the longest length 8; logn is 1 up to L=8: identical to the model without them"
    )
    assert noop_reason((_att("logn", length=8), _att("self-extend", group_size=2, neighbor_window=4)), [8], 64) is None


def test_far_positions_as_the_papers_write_them():
    from ctxeval.attention.methods import far_positions

    q, k = np.array([20, 21, 40]), np.array([0, 3, 9])
    got = far_positions(_att("self-extend", group_size=4, neighbor_window=10), q, k)
    assert [g.tolist() for g in got] == [[5 + 10 - 2, 5 + 8, 10 + 8], [0, 0, 2]]
    got = far_positions(_att("rerope", window=7), q, k)
    assert [g.tolist() for g in got] == [[7, 7, 7], [0, 0, 0]]
    got = far_positions(_att("leaky-rerope", window=8, k=4), q, k)
    assert [g.tolist() for g in got] == [[11.0, 11.25, 16.0], [0.0, 0.75, 2.25]]
    with pytest.raises(ValueError, match="^logn does not remap positions$"):
        far_positions(_att("logn"), q, k)


def test_relative_positions_of_each_method():
    from ctxeval.attention.methods import relative_position

    d = np.arange(0, 40, 3)  # 0, 3, ..., 39
    assert relative_position(_att("logn"), d).tolist() == d.tolist()
    se = relative_position(_att("self-extend", group_size=4, neighbor_window=10), d)
    assert se.tolist() == [x if x < 10 else x // 4 + 10 - 2 for x in d]
    assert relative_position(_att("rerope", window=9), d).tolist() == [min(x, 9) for x in d]
    leaky = relative_position(_att("leaky-rerope", window=9, k=2), d)
    assert leaky.tolist() == [x if x < 9 else 9 + (x - 9) / 2 for x in d]
    assert relative_position(_att("rerope", window=9), [9]).tolist() == [9.0]


def test_pair_positions_change_from_the_window_on():
    import torch

    from ctxeval.attention.methods import pair_positions

    qi, kj = torch.tensor([10, 10, 10, 10]), torch.tensor([0, 1, 2, 10])  # distances 10, 9, 8, 0
    q, k = pair_positions(_att("rerope", window=9), qi, kj)
    assert q.dtype == torch.float64 and q.tolist() == [9, 9, 10, 10] and k.tolist() == [0, 0, 2, 10]
    q, k = pair_positions(_att("logn"), qi, kj)
    assert q.dtype == k.dtype == torch.float64 and q.tolist() == [10] * 4 and k.tolist() == [0, 1, 2, 10]


def test_logn_scale_is_one_up_to_the_trained_length_and_log_ratio_past_it():
    import math

    import torch

    from ctxeval.attention.methods import logn_scale

    got = logn_scale(torch.tensor([[0, 14, 15, 16, 255]]), 16)
    assert got.dtype == torch.float64
    assert got.tolist() == [[1.0, 1.0, 1.0, pytest.approx(math.log(17) / math.log(16)), pytest.approx(2.0)]]


def test_a_model_whose_attention_is_not_seen_is_refused():
    from ctxeval.data.corpora import TokenDoc
    from ctxeval.evals.entropy import EntropyCapture

    runner, _ = _runner()
    with pytest.raises(
        CtxevalError,
        match=r"^entropy: no attention call was seen; this model does not use "
        r"transformers' attention functions \(sdpa\)$",
    ):
        runner._forward(EntropyCapture(None, None, 8), TokenDoc("d", np.arange(5, 45)), 8)  # not watching sdpa


def test_the_entropy_sweep_measures_what_the_runner_measures_with_bos_per_method(tmp_path):
    """Each method's rows equal EntropyRunner's under that method (BOS first, as the tokenizer gives it); a
    length-dependent method gets one forward per length, a static one one forward at the longest length."""
    from ctxeval.data.corpora import TokenDoc
    from ctxeval.evals.entropy import EntropyConfig, EntropyRunner, capture, sweep
    from ctxeval.evals.sweep import applying
    from ctxeval.models.load import load_model
    from ctxeval.runs.store import RunStore
    from ctxeval.specs import expand_specs
    from ctxeval.tiny import MODEL_DIR

    lm = load_model(str(MODEL_DIR), device="cpu", dtype="float32")
    assert lm.tokenizer.bos_token_id is not None
    specs = expand_specs(["none", "dynamic-ntk"])
    doc = TokenDoc("d", np.arange(5, 305) % 100 + 3)
    cfg = EntropyConfig((64, 256), layers=(1,))  # the tiny model is trained on 128: dynamic NTK scales past it
    store = RunStore(tmp_path / "run", {"t": 1})
    store.start({})
    notes = _Notes()
    sweep(lm, specs, [doc], cfg, store, notes)
    got = {(r["label"], r["length"]): r["entropy"] for r in store.rows()}
    runner = EntropyRunner(lm.model, "cpu", cfg, lm.tokenizer.bos_token_id, lm.name)
    want = {}
    with capture(lm.model, cfg) as cap:
        for spec, static in ((specs[0], True), (specs[1], False)):
            rows = []
            with applying(lm, spec, cfg.lengths):
                runner.measure(spec, doc, [64, 256], cap, rows.extend, static=static)
            want.update({(r["label"], r["length"]): r["entropy"] for r in rows})
    assert got == pytest.approx(want, abs=1e-9)
    assert got[("dynamic-ntk", 64)] == got[("none", 64)] != got[("dynamic-ntk", 256)]  # NTK only past 128
    assert got[("dynamic-ntk", 256)] != pytest.approx(got[("none", 256)], abs=1e-6)
    assert notes.events[0] == ("start", 256 + 64 + 256)  # the static method's longest length, the dynamic one's sum
    assert [e for e in notes.events if e[0] == "advance"] == [
        ("advance", 256, "none d L=256"),
        ("advance", 64, "dynamic-ntk d L=64"),
        ("advance", 256, "dynamic-ntk d L=256"),
    ]


def test_the_query_chunk_is_the_largest_the_byte_budget_allows(monkeypatch):
    """Two float32 [2 heads, chunk, 9 keys] tensors per chunk: a budget of 8 * 2 * 9 * 3 bytes gives chunks of 3
    queries, a budget below one query's gives chunks of 1."""
    from types import SimpleNamespace

    import torch

    from ctxeval.evals.entropy import EntropyCapture

    q, k = _qk(n=9)
    real, chunks = torch.einsum, []

    def recording(eq, *ops):
        out = real(eq, *ops)
        chunks.append(out.shape[1])
        return out

    monkeypatch.setattr(torch, "einsum", recording)
    for budget, want in ((8 * 2 * 9 * 3, [3, 3, 3]), (8 * 2 * 9 * 3 - 1, [2, 2, 2, 2, 1]), (1, [1] * 9)):
        chunks.clear()
        cap = EntropyCapture(None, None, 100, chunk_bytes=budget)
        cap.observe(SimpleNamespace(layer_idx=0), q, k, None, 0.5, {})
        assert chunks == want * 2, budget  # two key/value heads
        assert torch_close(cap.per_layer[0], _reference_entropy(q, k, range(4), 0.5))


def test_native_with_a_shipped_dynamic_rope_is_measured_length_by_length(tmp_path):
    import dataclasses

    from ctxeval.data.corpora import TokenDoc
    from ctxeval.evals.entropy import EntropyConfig, sweep
    from ctxeval.models.load import load_model
    from ctxeval.runs.store import RunStore
    from ctxeval.specs import expand_specs
    from ctxeval.tiny import MODEL_DIR

    lm = load_model(str(MODEL_DIR), device="cpu", dtype="float32")
    lm.rope = dataclasses.replace(lm.rope, shipped={**lm.rope.shipped, "rope_type": "dynamic"})
    store = RunStore(tmp_path / "run", {"t": 1})
    store.start({})
    notes = _Notes()
    sweep(
        lm,
        expand_specs(["native"]),
        [TokenDoc("d", np.arange(5, 45))],
        EntropyConfig((16, 32), layers=(0,)),
        store,
        notes,
    )
    assert notes.events[0] == ("start", 16 + 32)
    assert [e for e in notes.events if e[0] == "advance"] == [
        ("advance", 16, "native d L=16"),
        ("advance", 32, "native d L=32"),
    ]


@pytest.mark.parametrize(
    "text",
    [
        "logn",
        "rerope:window=6",
        "leaky-rerope:window=6,k=2,logn=false",
        "self-extend:group_size=2,neighbor_window=4+logn:length=8",
    ],
)
def test_the_reference_probe_equals_attend_with_logn_past_its_length(text):
    """reference_attention (the probe's per-pair float64 formula) and attend (the chunked kernel) agree, logn's
    query scaling included: positions run past L = 8 (the trained length, logn's default), where the scale exceeds 1."""
    import torch

    from ctxeval.attention.methods import attend, reference_attention, rotate
    from ctxeval.specs import expand_specs

    specs = expand_specs([text])[0].attention
    g = torch.Generator().manual_seed(2)
    heads, t, dim = 2, 24, 8
    q_raw, k_raw, v = (torch.randn(heads, t, dim, generator=g, dtype=torch.float64) for _ in range(3))
    pos = torch.arange(t)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    ref = reference_attention(q_raw, k_raw, v, pos, pos, inv_freq, specs, dim**-0.5, 8)
    q, k = rotate(q_raw[None], pos[None], inv_freq), rotate(k_raw[None], pos[None], inv_freq)
    got = attend(q, k, v[None], pos[None], pos[None], None, dim**-0.5, inv_freq, specs, 8)[0]
    assert float((ref - got).abs().max()) < 1e-5
    plain = reference_attention(q_raw, k_raw, v, pos, pos, inv_freq, (), dim**-0.5, 8)
    assert float((ref[9:] - plain[9:]).abs().max()) > 1e-3 and float((ref[:4] - plain[:4]).abs().max()) < 1e-12


def _attend_inputs(batch=1, heads=4, kv=2, t=12, dim=8, dtype=None, seed=3):
    import torch

    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, h, t, dim, generator=g) for h in (heads, kv, kv))
    if dtype is not None:
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    pos = torch.arange(t)[None] + 5 * torch.arange(batch)[:, None]  # each sequence at its own positions
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    return q, k, v, pos, inv_freq


@pytest.mark.parametrize("text", ["self-extend:group_size=2,neighbor_window=4", "leaky-rerope:window=4,k=2"])
def test_attend_on_a_batch_equals_each_sequence_alone(text):
    import torch

    from ctxeval.attention.methods import attend
    from ctxeval.specs import expand_specs

    specs = expand_specs([text])[0].attention
    q, k, v, pos, inv_freq = _attend_inputs(batch=2)
    both = attend(q, k, v, pos, pos, None, 0.35, inv_freq, specs, 8)
    for b in (0, 1):
        alone = attend(
            q[b : b + 1], k[b : b + 1], v[b : b + 1], pos[b : b + 1], pos[b : b + 1], None, 0.35, inv_freq, specs, 8
        )
        torch.testing.assert_close(both[b : b + 1], alone, atol=1e-6, rtol=1e-6)


def test_attend_returns_the_querys_dtype():
    import torch

    from ctxeval.attention.methods import attend
    from ctxeval.specs import expand_specs

    q, k, v, pos, inv_freq = _attend_inputs(dtype=torch.float64)
    out = attend(q, k, v, pos, pos, None, 0.35, inv_freq, expand_specs(["rerope:window=4"])[0].attention, 8)
    assert out.dtype == torch.float64 and out.shape == (1, 12, 4, 8)


@pytest.mark.parametrize("text, maps", [("rerope:window=4", 2), ("logn:length=4", 1)])
def test_attends_query_chunk_is_the_largest_the_score_budget_allows(monkeypatch, text, maps):
    """float32 score maps (both maps of a remapping method, and the probabilities) of a chunk fit the budget: a budget
    of exactly 3 queries' worth gives chunks of 3, a budget under one query's chunks of 1; the output is the same."""
    import torch

    from ctxeval.attention import methods as A
    from ctxeval.specs import expand_specs

    specs = expand_specs([text])[0].attention
    q, k, v, pos, inv_freq = _attend_inputs()
    full = A.attend(q, k, v, pos, pos, None, 0.35, inv_freq, specs, 8)
    real, rows = torch.softmax, []

    def recording(x, dim):
        rows.append(x.shape[-2])
        return real(x, dim=dim)

    monkeypatch.setattr(torch, "softmax", recording)
    for budget, want in ((1 * 4 * 12 * 4 * (maps + 1) * 3, [3, 3, 3, 3]), (100, [1] * 12)):
        rows.clear()
        monkeypatch.setattr(A, "SCORE_BUDGET_BYTES", budget)
        out = A.attend(q, k, v, pos, pos, None, 0.35, inv_freq, specs, 8)
        assert rows == want
        torch.testing.assert_close(out, full, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize(
    "prefix, bos, want", [((), False, [1, 2, 5]), ((), True, [2, 3, 6]), ((7,), False, [1, 4]), ((7,), True, [1, 2, 5])]
)
def test_evaluator_key_tokens_map_to_the_evaluated_sequence_down_to_position_1(monkeypatch, prefix, bos, want):
    """With a one-token short context the evaluator's key token can be its position 1; it maps to the evaluated
    sequence's position 1 - len(prefix) + bos, and only position 0 (no loss) is dropped."""
    from ctxeval.evals import key_tokens as K

    calls = []

    def found(model, device, sequence, context, window, alpha, beta, chunk_size):
        calls.append((list(sequence), context, window, alpha, beta, chunk_size))
        return np.array([1, 2, 5], dtype=np.int64)

    monkeypatch.setattr(K, "key_positions", found)
    settings = _settings(context=1, window=1, evaluator_prefix=prefix, bos=bos, alpha=0.5, beta=3.0)
    assert K.evaluator_keys(None, "cpu", [10, 11, 12, 13, 14, 15], settings, chunk_size=7).tolist() == want
    assert calls == [(list(prefix) + [10, 11, 12, 13, 14, 15], 1, 1, 0.5, 3.0, 7)]
