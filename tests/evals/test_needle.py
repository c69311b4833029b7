"""needle / passkey: exact prompt lengths, intact needles, scoring, forced vs generate, resume, outputs, bad input."""

import json

import numpy as np
import pytest
from helpers import build_tokenizer
from typer.testing import CliRunner

from ctxeval.cli import app
from ctxeval.data.presets import load_task, preset_names
from ctxeval.errors import CtxevalError
from ctxeval.evals import haystack as H
from ctxeval.evals import needle as N

runner = CliRunner()


PRESETS = [n.removeprefix("needle-") for n in preset_names("needle")]


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def preset(name):
    return H.NeedlePreset.from_dict(name, load_task(f"needle-{name}", "needle"))


def builder(tok, name, chat=False, snap=False, hay="filler"):
    ids, _ = H.haystack_tokens(tok, hay, 4000)
    return H.PromptBuilder(tok, preset(name), ids, chat_template=chat, snap=snap)


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("depth", [0.0, 33.3, 50.0, 100.0])
@pytest.mark.parametrize("chat", [False, True])
def test_prompt_length_exact_needles_intact_one_bos(tok, name, depth, chat):
    if chat:
        tok.chat_template = "{% for m in messages %}<s>[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}[assistant] "
    else:
        tok.chat_template = None
    b = builder(tok, name, chat=chat)
    for length in (900, 1111):
        rng = np.random.default_rng([1, length])
        sample = H.make_sample(b.preset, rng)
        for reserve in (len(b.answer_ids(sample)), 24):
            p = b.build(length, depth, sample, np.random.default_rng(7), reserve)
            assert len(p.ids) + reserve == length
            assert p.ids.count(tok.bos_token_id) == 1 and p.ids[0] == tok.bos_token_id  # BOS once, first
            for needle_text, (start, end) in zip(sample.needles, p.needle_spans):
                assert p.ids[start:end] == b.encode(" " + needle_text)  # intact, contiguous
            head = len(b.fixed_tokens(sample)[0])
            before = sum(e - s for s, e in p.needle_spans if s < p.needle_spans[0][0])
            assert p.needle_spans[0][0] - head - before == round(depth / 100 * p.haystack_tokens)
            assert len(p.answer_ids) == len(b.answer_ids(sample))
            decoded = tok.decode(p.answer_ids)
            assert all(a in decoded for a in sample.answers)
            if b.preset.values_per_key > 1:  # forced answers list the values in reading order
                by_text = sorted(sample.answers[: b.preset.values_per_key], key=lambda a: decoded.index(a))
                by_span = [
                    sample.answers[j]
                    for j in sorted(range(b.preset.values_per_key), key=lambda j: p.needle_spans[j][0])
                ]
                assert by_text == by_span
    tok.chat_template = None


def test_snap_moves_needle_to_a_sentence_end(tok):
    b = builder(tok, "magic-number", snap=True)
    sample = H.make_sample(b.preset, np.random.default_rng(0))
    p = b.build(600, 47.0, sample, np.random.default_rng(3), 10)
    start = p.needle_spans[0][0]
    assert tok.decode(p.ids[start - 1 : start]).rstrip(" ")[-1] in ".!?\n"
    assert p.depth_tokens <= round(0.47 * p.haystack_tokens)


def test_samples_are_seeded_and_distinct():
    pr = preset("magic-number-multikey")
    a, b = H.make_sample(pr, np.random.default_rng(5)), H.make_sample(pr, np.random.default_rng(5))
    assert a == b and len(a.needles) == 4 and len(a.answers) == 1
    mv = H.make_sample(preset("magic-number-multivalue"), np.random.default_rng(1))
    assert len(mv.answers) == 4 == len(set(mv.answers))
    mq = H.make_sample(preset("magic-number-multiquery"), np.random.default_rng(1))
    assert mq.question.count("-") == 4 and " and " in mq.question
    pk = H.make_sample(preset("passkey"), np.random.default_rng(2))
    assert 1 <= int(pk.answers[0]) <= 50000


def test_scoring_rules():
    ruler = H.make_sample(preset("magic-number-multivalue"), np.random.default_rng(0))
    p = preset("magic-number-multivalue")
    assert H.score_response(p, ruler, " " + ", ".join(ruler.answers) + ".")
    assert not H.score_response(p, ruler, " " + ", ".join(ruler.answers[:3]))
    pk, pkp = H.Sample(("x",), 1, "q", "a", ("4242",)), preset("passkey")
    assert H.score_response(pkp, pk, " 4242. Remember 99")
    assert not H.score_response(pkp, pk, " 99 and then 4242")
    assert not H.score_response(pkp, pk, " 42420")
    gk, gkp = H.Sample(("x",), 1, "q", "a", ("eat",)), preset("gkamradt")
    assert H.score_response(gkp, gk, " to eat a Sandwich in dolores park.")
    assert not H.score_response(gkp, gk, " to visit Dolores Park.")


# ------------------------------------------------------------------------------------------------------- CLI
def needle(*args):
    return runner.invoke(app, ["needle", *args])


def test_several_values_per_key_are_expected_in_reading_order():
    from types import SimpleNamespace

    sample = H.Sample(("n1", "n2", "n3", "n4", "d"), 4, "q", "prefix", ("a1", "a2", "b1", "b2"))
    spans = [(50, 60), (10, 20), (90, 95), (70, 80), (0, 5)]  # a2 before a1, b2 before b1
    owner = SimpleNamespace(preset=SimpleNamespace(values_per_key=2))
    ordered = H.PromptBuilder.reading_order(owner, sample, spans)
    assert ordered == H.Sample(("n1", "n2", "n3", "n4", "d"), 4, "q", "prefix", ("a2", "a1", "b2", "b1"))


def _enc(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("chat", [False, True])
def test_a_prompt_is_its_parts_in_order(tok, chat):
    """head = BOS + (chat prefix) + instruction + newline; the haystack a contiguous slice with the needles set in at
    their spans, the first at depth% of it; tail = newline + question + (chat suffix) + answer prefix."""
    tok.chat_template = (
        "{% for m in messages %}<s>[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}[assistant] " if chat else None
    )
    b = builder(tok, "magic-number-multikey", chat=chat)
    sample = H.make_sample(b.preset, np.random.default_rng(3))
    p = b.build(1200, 40.0, sample, np.random.default_rng(5), 10)
    if chat:  # the template's own <s> is the BOS (not doubled); its text before and after the user turn
        head = _enc(tok, "<s>[user] ") + _enc(tok, b.preset.instruction + "\n")
        tail = _enc(tok, "\n" + sample.question) + _enc(tok, "\n[assistant] ") + _enc(tok, sample.answer_prefix)
    else:
        head = [tok.bos_token_id] + _enc(tok, b.preset.instruction + "\n")
        tail = _enc(tok, "\n" + sample.question) + _enc(tok, " " + sample.answer_prefix)
    assert p.ids[: len(head)] == head and p.ids[-len(tail) :] == tail
    middle, kept, cursor = p.ids[len(head) : len(p.ids) - len(tail)], [], len(head)
    for start, end in sorted(p.needle_spans):
        kept += p.ids[cursor:start]
        cursor = end
    kept += p.ids[cursor : len(p.ids) - len(tail)]
    assert len(kept) == p.haystack_tokens == len(middle) - sum(e - s for s, e in p.needle_spans)
    hay = b.haystack.tolist()
    offset = next(i for i in range(len(hay) - len(kept) + 1) if hay[i : i + len(kept)] == kept)  # one slice
    assert hay[offset : offset + len(kept)] == kept
    first_start = p.needle_spans[0][0] - len(head)
    assert p.depth_tokens == round(0.40 * p.haystack_tokens)
    assert first_start - sum(e - s for s, e in p.needle_spans if s < p.needle_spans[0][0]) == p.depth_tokens
    assert p.answer_ids == b.answer_ids(sample)
    tok.chat_template = None


def test_answer_tokens_are_the_values_comma_separated():
    tok = build_tokenizer()
    b = builder(tok, "magic-number-multivalue")
    sample = H.Sample(("x",), 1, "q", "a", ("1234", "5678", "90"))
    assert b.answer_ids(sample) == (
        _enc(tok, " 1234") + _enc(tok, ",") + _enc(tok, " 5678") + _enc(tok, ",") + _enc(tok, " 90")
    )


def test_the_haystack_offset_stays_inside_the_haystack(tok):
    """A budget equal to the haystack leaves one valid offset, 0: every seed must take it."""
    b = builder(tok, "passkey")
    sample = H.make_sample(b.preset, np.random.default_rng(0))
    head, tail, needles, _ = b.fixed_tokens(sample)
    fixed = len(head) + len(tail) + sum(map(len, needles))
    small = H.PromptBuilder(tok, b.preset, b.haystack[:300], chat_template=False)
    for seed in range(20):
        p = small.build(fixed + 300 + 5, 50.0, sample, np.random.default_rng(seed), 5)
        assert p.haystack_tokens == 300 and len(p.ids) + 5 == fixed + 300 + 5


def test_too_short_lengths_and_haystacks_say_what_is_needed(tok):
    b = builder(tok, "passkey")
    sample = H.make_sample(b.preset, np.random.default_rng(0))
    need = b.minimum_length(sample, 5)
    head, tail, needles, _ = b.fixed_tokens(sample)
    assert need == len(head) + len(tail) + sum(map(len, needles)) + 5 + 1  # at least one haystack token
    assert len(b.build(need, 50.0, sample, np.random.default_rng(0), 5).ids) == need - 5
    for short in (need - 1, need - 6):
        with pytest.raises(CtxevalError) as caught:
            b.build(short, 50.0, sample, np.random.default_rng(0), 5)
        assert str(caught.value) == (
            f"length {short} is shorter than the instruction, needle(s), question and answer "
            f"({need} tokens with this tokenizer); use longer --lengths"
        )
    small = H.PromptBuilder(tok, b.preset, b.haystack[:50], chat_template=False)
    assert small.build(need + 49, 50.0, sample, np.random.default_rng(0), 5).haystack_tokens == 50  # all of it
    with pytest.raises(CtxevalError) as caught:
        small.build(need + 50, 50.0, sample, np.random.default_rng(0), 5)
    assert str(caught.value) == (
        f"the haystack has 50 tokens but length {need + 50} needs 51; use a longer "
        "--haystack corpus or shorter --lengths"
    )


def test_snap_puts_the_needle_after_the_nearest_sentence_end_before_it(tok):
    ids, _ = H.haystack_tokens(tok, "filler", 4000)
    b = H.PromptBuilder(tok, preset("passkey"), ids, chat_template=False, snap=True)
    sample = H.make_sample(b.preset, np.random.default_rng(0))
    head = len(b.fixed_tokens(sample)[0])

    def ends_sentence(token):
        text = tok.decode([token])
        return "\n" in text or text.rstrip()[-1:] in (".", "!", "?")

    for depth in (0.0, 12.5, 37.0, 61.0, 100.0):
        p = b.build(1500, depth, sample, np.random.default_rng(1), 6)
        hay = p.ids[head : p.needle_spans[0][0]]  # the haystack before the needle
        unsnapped = round(depth / 100 * p.haystack_tokens)
        assert p.depth_tokens == len(hay) <= unsnapped
        if 0 < p.depth_tokens < p.haystack_tokens:
            assert ends_sentence(hay[-1])
        # no sentence end was skipped between the snapped and the unsnapped position
        rest = p.ids[p.needle_spans[0][1] : p.needle_spans[0][1] + unsnapped - p.depth_tokens]
        assert len(rest) == unsnapped - p.depth_tokens and not any(ends_sentence(t) for t in rest)


def test_a_corpus_haystack_is_its_documents_joined_by_a_blank_line(tmp_path, tok):
    texts = ["First document. It ends here.", "Second one, longer: " + "words and more words. " * 20, "Third."]
    for i, text in enumerate(texts):
        (tmp_path / f"{i}.txt").write_text(text)
    ids, info = H.haystack_tokens(tok, str(tmp_path), 10_000)  # more than the corpus: every document, in order
    sep = _enc(tok, "\n\n")
    docs = sorted(tmp_path.glob("*.txt"))
    expected = sum((_enc(tok, p.read_text()) + sep for p in docs), [])
    assert ids.tolist() == expected
    assert info == {
        "haystack": str(tmp_path),
        "documents": [{"doc": str(p), "tokens": len(_enc(tok, p.read_text()))} for p in docs],
    }
    few, info = H.haystack_tokens(tok, str(tmp_path), 5)  # the first document already holds 4 x the tokens asked
    assert [d["doc"] for d in info["documents"]] == [str(docs[0])] and few.tolist() == _enc(tok, texts[0]) + sep
    filler, info = H.haystack_tokens(tok, "filler", 1000)
    unit = _enc(tok, " " + H.FILLER)
    assert (
        len(filler) >= 1001
        and filler.tolist()[: len(unit)] == unit
        and info == {"haystack": "filler", "text": H.FILLER}
    )


def test_keys_within_a_sample_never_repeat():
    multikey = preset("magic-number-multikey")  # 4 of 1638 keys: with repeats allowed, ~10 of 5000 samples repeat one
    for seed in range(5000):
        sample = H.make_sample(multikey, np.random.default_rng(seed))
        keys = [n.split(" for ")[1].split(" is")[0] if " for " in n else n for n in sample.needles]
        assert len(set(sample.needles)) == len(sample.needles) and len(set(keys)) == len(keys), sample.needles


def test_a_cell_draws_the_same_sample_and_random_depth_every_time(tok):
    b = builder(tok, "passkey")
    cfg = N.NeedleConfig((600,), (), samples=3, random_depth=True)
    runner_ = N.NeedleRunner(None, tok, "cpu", b, cfg, "tiny", "passkey")
    first = [runner_.item(600, 0, s) for s in range(3)]
    again = [runner_.item(600, 0, s) for s in range(3)]
    assert [(i.sample, i.depth, i.prompt.ids) for i in first] == [(i.sample, i.depth, i.prompt.ids) for i in again]
    for s, it in enumerate(first):  # passkey: a uniform depth in [0, 100] per sample, to two decimals
        rng = cfg.rng(600, 0, s)
        H.make_sample(b.preset, rng)
        assert it.depth == round(float(rng.uniform(0, 100)), 2) and 0 <= it.depth <= 100
        assert it.depth_index == 0 and it.sample_index == s and it.length == 600
    assert len({i.depth for i in first}) == 3


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(lengths=()), "give at least one --lengths value"),
        (dict(samples=0), "--samples must be >= 1, got 0"),
        (dict(scoring="judge"), "--scoring must be one of " + ", ".join(N.SCORINGS) + ", got 'judge'"),
        (dict(depths=(50.0, 100.5, -1.0)), "depths are percentages in 0..100, got 100.5"),
        (dict(depths=()), "give at least one --depths value"),
        (dict(batch_size=0), "--batch-size must be >= 1, got 0"),
        (dict(max_new_tokens=0), "--max-new-tokens must be >= 1, got 0"),
    ],
)
def test_needle_settings_are_refused_in_one_line(kwargs, message):
    with pytest.raises(CtxevalError) as caught:
        N.NeedleConfig(**{"lengths": (600,), "depths": (50.0,), **kwargs})
    assert str(caught.value) == message


def test_the_smallest_settings_are_allowed():
    cfg = N.NeedleConfig((600,), (0.0, 100.0), samples=1, batch_size=1, max_new_tokens=1)
    assert (cfg.batch_size, cfg.max_new_tokens, cfg.depths) == (1, 1, (0.0, 100.0))


def test_needle_values_have_the_digits_and_range_their_spec_says():
    rng = np.random.default_rng(0)
    digits = [H._value("digits:7", rng) for _ in range(3000)]
    assert all(len(v) == 7 and v[0] != "0" for v in digits)
    assert min(map(int, digits)) < 1_100_000 and max(map(int, digits)) > 9_900_000  # the whole 7-digit range
    ints = {H._value("int:3:5", rng) for _ in range(300)}
    assert ints == {"3", "4", "5"}  # both ends included
    assert H._value("fixed:eat a sandwich: at noon", rng) == "eat a sandwich: at noon"


def test_several_queried_keys_are_named_in_the_question():
    multiquery = preset("magic-number-multiquery")
    sample = H.make_sample(multiquery, np.random.default_rng(4))
    keys = [n.split(" for ")[1].split(" is")[0] for n in sample.needles[: multiquery.keys]]
    key_text = ", ".join(keys[:-1]) + " and " + keys[-1]
    assert multiquery.keys > 2 and sample.question == multiquery.question.format(keys=key_text)
    assert sample.answer_prefix == multiquery.answer_prefix.format(keys=key_text)
    assert sample.n_queried == multiquery.keys * multiquery.values_per_key == len(sample.answers)
    single = H.make_sample(preset("magic-number"), np.random.default_rng(4))
    one_key = single.needles[0].split(" for ")[1].split(" is")[0]
    assert single.question == preset("magic-number").question.format(keys=one_key) and single.n_queried == 1
    multivalue = preset("magic-number-multivalue")
    values = H.make_sample(multivalue, np.random.default_rng(4))
    assert len(set(values.answers)) == len(values.answers) == multivalue.values_per_key == values.n_queried
    assert [n.split(": ")[1].rstrip(".") for n in values.needles[: multivalue.values_per_key]] == list(values.answers)


BASE_PRESET = {
    "instruction": "Remember.",
    "needle": "The {key} is {value}.",
    "question": "What is {keys}?",
    "answer_prefix": "The {keys} is",
    "value": "digits:4",
}


@pytest.mark.parametrize(
    "change, message",
    [
        ({"colour": "red", "size": 2}, "needle preset 'p' has unknown keys: colour, size"),
        ({"name": "other"}, "needle preset 'p' has unknown keys: name"),
        ({"match": "any"}, "needle preset 'p': match must be all, first_int or terms"),
        ({"value": "digits:x"}, "needle preset 'p': value must be digits:N, int:LO:HI or fixed:TEXT, got 'digits:x'"),
        ({"keys": 0}, "needle preset 'p': keys and values_per_key must be >= 1, distractors >= 0"),
        ({"values_per_key": 0}, "needle preset 'p': keys and values_per_key must be >= 1, distractors >= 0"),
        ({"distractors": -1}, "needle preset 'p': keys and values_per_key must be >= 1, distractors >= 0"),
        (
            {"distractors": 1638},
            "needle preset 'p': keys + distractors is 1639, more than the 1638 distinct keys; use fewer",
        ),
        ({"value": "digits:0"}, "needle preset 'p': value digits:N needs 1 <= N <= 18, got 'digits:0'"),
        ({"value": "int:5:3"}, "needle preset 'p': value int:LO:HI needs LO <= HI, got 'int:5:3'"),
        (
            {"value": "int:1:4", "keys": 2, "values_per_key": 2, "distractors": 1},
            "needle preset 'p': value 'int:1:4' has 4 distinct values for 5 needles (keys x values_per_key + distractors); "
            "widen its range",
        ),
        (
            {"value": "digits:2", "distractors": 90},
            "needle preset 'p': value 'digits:2' has 90 distinct values for 91 needles "
            "(keys x values_per_key + distractors); widen its range",
        ),
        (
            {"value": "digits:1", "distractors": 9},
            "needle preset 'p': value 'digits:1' has 9 distinct values for 10 needles "
            "(keys x values_per_key + distractors); widen its range",
        ),
        ({"needle": "The {key} is here."}, "needle preset 'p': the needle text must contain {value}"),
        ({"needle": "The {key is {value}."}, "needle preset 'p': bad braces in needle: "),
        (
            {"needle": "The {key} is {value} {when}."},
            "needle preset 'p': needle may use only {key}, {value}, got {when} (write {{ and }} for literal braces)",
        ),
        (
            {"question": "What is {key}?"},
            "needle preset 'p': question may use only {keys}, got {key} (write {{ and }} for literal braces)",
        ),
        (
            {"answer_prefix": "{value} {x}"},
            "needle preset 'p': answer_prefix may use only {keys}, got {value}, {x} (write "
            "{{ and }} for literal braces)",
        ),
    ],
)
def test_a_custom_preset_is_refused_in_one_line_that_names_the_problem(change, message):
    with pytest.raises(CtxevalError) as caught:
        H.NeedlePreset.from_dict("p", {**BASE_PRESET, **change})
    assert str(caught.value).startswith(message) and (message.endswith(": ") or str(caught.value) == message)


def test_a_valid_custom_preset_loads():
    p = H.NeedlePreset.from_dict(
        "p",
        {
            **BASE_PRESET,
            "match": "terms",
            "match_terms": ["a", "b"],
            "distractors": 0,
            "value": "fixed:no braces",
            "needle": "A fixed needle.",
        },
    )
    assert p.match_terms == ("a", "b") and p.name == "p" and p.distractors == 0
    # just enough distinct values, the most keys, and fixed text on more needles than it has values all load
    for exact in (
        {"value": "int:1:5", "keys": 2, "values_per_key": 2, "distractors": 1},
        {"value": "digits:1", "distractors": 8},
        {"value": "int:7:7"},
        {"distractors": 1637},
        {"value": "digits:2", "distractors": 89},
        {"value": "fixed:x", "distractors": 3},
    ):
        assert H.NeedlePreset.from_dict("p", {**BASE_PRESET, **exact}).value == exact.get("value", "digits:4")


def _tokenizer_adding_bos():
    """The test tokenizer with a post-processor that prepends <s>, as Llama's does for add_special_tokens=True."""
    from tokenizers.processors import TemplateProcessing

    tok = build_tokenizer()
    tok._tokenizer.post_processor = TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.bos_token_id)])
    assert (
        tok("a")["input_ids"][0] == tok.bos_token_id
        and tok("a", add_special_tokens=False)["input_ids"][0] != tok.bos_token_id
    )
    return tok


def test_haystacks_and_prompt_parts_carry_no_special_tokens(tmp_path):
    tok = _tokenizer_adding_bos()
    filler, _ = H.haystack_tokens(tok, "filler", 500)
    (tmp_path / "a.txt").write_text("One. Two.")
    (tmp_path / "b.txt").write_text("Three.")
    corpus, _ = H.haystack_tokens(tok, str(tmp_path), 10_000)
    assert tok.bos_token_id not in filler.tolist() and tok.bos_token_id not in corpus.tolist()
    assert len(filler) >= 501 and len(filler) < 501 + 3 * len(_enc(tok, " " + H.FILLER))  # enough, not far more
    b = H.PromptBuilder(tok, preset("passkey"), filler, chat_template=False)
    sample = H.make_sample(b.preset, np.random.default_rng(0))
    p = b.build(400, 50.0, sample, np.random.default_rng(0), 6)
    assert p.ids.count(tok.bos_token_id) == 1 and p.ids[0] == tok.bos_token_id  # only the one BOS, first
    assert b.answer_ids(sample) == _enc(tok, " " + sample.answers[0])


def test_a_tokenizer_without_bos_and_a_prompt_without_it():
    tok = build_tokenizer()
    ids, _ = H.haystack_tokens(tok, "filler", 2000)
    sample = H.make_sample(preset("passkey"), np.random.default_rng(0))
    no_bos = H.PromptBuilder(tok, preset("passkey"), ids, chat_template=False, bos=False)
    assert tok.bos_token_id not in no_bos.build(400, 50.0, sample, np.random.default_rng(0), 6).ids
    tok.bos_token = None  # a tokenizer that has none (GPT-2 style)
    assert tok.bos_token_id is None
    none = H.PromptBuilder(tok, preset("passkey"), ids, chat_template=False)
    assert None not in none.build(400, 50.0, sample, np.random.default_rng(0), 6).ids
    assert not none.snap  # snapping to sentence ends is asked for, not the default


def test_a_chat_template_without_its_own_bos_gets_one_and_the_assistant_turn_is_opened():
    tok = build_tokenizer()
    tok.chat_template = (
        "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant] {% endif %}"
    )
    ids, _ = H.haystack_tokens(tok, "filler", 2000)
    b = H.PromptBuilder(tok, preset("passkey"), ids, chat_template=True)
    sample = H.make_sample(b.preset, np.random.default_rng(0))
    p = b.build(500, 50.0, sample, np.random.default_rng(0), 6)
    head = [tok.bos_token_id] + _enc(tok, "[user] ")  # the template has no <s>: ctxeval's BOS comes first
    assert p.ids[: len(head)] == head
    tail = _enc(tok, "\n[assistant] ") + _enc(tok, sample.answer_prefix)  # the generation prompt is asked for
    assert p.ids[-len(tail) :] == tail


def test_distractors_get_one_value_each_and_no_value_repeats_across_needles():
    from dataclasses import replace

    # two values for the queried key, three distractor keys; values from {1, ..., 5}: five needles, five values
    small = replace(preset("magic-number-multivalue"), values_per_key=2, distractors=3, value="int:1:5")
    for seed in range(40):  # 5 draws from 5 values collide in almost every sample: the retry is what keeps them apart
        sample = H.make_sample(small, np.random.default_rng(seed))
        pairs = [(n.split(" for ")[1].split(" is")[0], n.split(": ")[1].rstrip(".")) for n in sample.needles]
        assert len(pairs) == 5 and sorted(v for _, v in pairs) == ["1", "2", "3", "4", "5"], sample.needles
        assert (
            pairs[0][0] == pairs[1][0] and len({k for k, _ in pairs[1:]}) == 4
        )  # the queried key twice, then 3 others
        assert sample.answers == (pairs[0][1], pairs[1][1]) and sample.n_queried == 2


def test_the_value_redraw_is_bounded_and_then_picks_a_free_value(monkeypatch):
    """After MAX_REDRAWS collisions the loop takes a value the sample does not hold yet (seeded), so it cannot spin;
    with a bound of 1 every collision goes there, and the five values are still the five distinct ones."""
    from dataclasses import replace

    small = replace(preset("magic-number-multivalue"), values_per_key=2, distractors=3, value="int:1:5")
    monkeypatch.setattr(H, "MAX_REDRAWS", 1)
    for seed in range(40):
        sample = H.make_sample(small, np.random.default_rng(seed))
        values = sorted(n.split(": ")[1].rstrip(".") for n in sample.needles)
        assert values == ["1", "2", "3", "4", "5"], sample.needles
    wide = replace(small, value="int:1:2000000")  # a range too wide to list: never reached in practice, refused here
    used = {str(v) for v in range(1, 6)}
    with pytest.raises(CtxevalError, match="widen its range"):
        H._unused_value(wide, used, np.random.default_rng(0))


@pytest.mark.parametrize(
    "value, fragment",
    [
        ("digits:99999", "1 <= N <= 18"),
        ("digits:19", "1 <= N <= 18"),
        ("digits:0", "1 <= N <= 18"),
        ("int:1:" + "9" * 5000, "more than 18 digits"),
    ],
)
def test_value_specs_past_64_bit_integers_are_refused(value, fragment):
    with pytest.raises(CtxevalError, match=fragment):
        H.NeedlePreset.from_dict("x", {**load_task("needle-magic-number", "needle"), "value": value})


def test_a_fixed_value_may_repeat_across_needles():
    from dataclasses import replace

    fixed = replace(preset("magic-number"), distractors=2, value="fixed:42")
    sample = H.make_sample(fixed, np.random.default_rng(0))  # no retry: it would never find another value
    assert [n.split(": ")[1] for n in sample.needles] == ["42."] * 3 and sample.answers == ("42",)


def test_further_needles_go_at_seeded_uniform_depths_of_the_haystack(tok):
    b = builder(tok, "magic-number-multikey")  # one queried needle, three distractors
    sample = H.make_sample(b.preset, np.random.default_rng(0))
    head, tail, needles, _ = b.fixed_tokens(sample)
    seen = []
    for seed in range(30):
        p = b.build(1000, 50.0, sample, np.random.default_rng(seed), 8)
        rng = np.random.default_rng(seed)
        rng.integers(0, len(b.haystack) - p.haystack_tokens + 1)  # the haystack offset is drawn first
        depths = [float(rng.uniform(0, 100)) for _ in needles[1:]]
        # a needle's start in the prompt: the head, the haystack before it, the needles placed before it
        offsets = [round(d / 100 * p.haystack_tokens) for d in [50.0] + depths]
        for i, (start, end) in enumerate(p.needle_spans):
            before = sum(len(needles[j]) for j in range(len(needles)) if (offsets[j], j) < (offsets[i], i))
            assert (start, end) == (len(head) + offsets[i] + before, len(head) + offsets[i] + before + len(needles[i]))
        seen += depths
    assert min(seen) < 5 and max(seen) > 95  # the whole haystack, not a corner of it


def _vocab_builder(texts, snap=True):
    from types import SimpleNamespace

    tokenizer = SimpleNamespace(bos_token_id=None, decode=lambda ids: texts[ids[0]])
    return H.PromptBuilder(tokenizer, preset("passkey"), np.arange(len(texts)), chat_template=False, snap=snap)


def test_a_sentence_ends_at_a_stop_mark_before_trailing_whitespace_or_at_a_newline():
    texts = ["Hello", " end.", "ok. ", "\n", "a\nb", "?  ", "", " ", "x.\t", ".x", "!", "MAX", "no,", "\u3002"]
    assert _vocab_builder(texts)._sentence_ends == {1, 2, 3, 4, 5, 8, 10}


def test_snapping_moves_back_to_a_sentence_end_or_the_haystack_start_and_leaves_the_end_alone():
    b = _vocab_builder(["word", " end."])
    hay = [0, 0, 1, 0, 0, 0, 0, 0, 0, 0]  # a sentence ends after the third token
    assert [b._position(d, hay) for d in (0.0, 10.0, 30.0, 60.0, 100.0)] == [0, 0, 3, 3, 10]
    assert b._position(10.0, [0] * 10) == 0 and b._position(100.0, [0] * 10) == 10  # no sentence end at all
    assert _vocab_builder(["word", " end."], snap=False)._position(60.0, hay) == 6


def test_an_empty_corpus_is_refused_in_one_line(tmp_path, tok):
    empty = tmp_path / "blank.jsonl"
    empty.write_text('{"text": ""}\n{"text": ""}\n')  # records, none with text
    with pytest.raises(CtxevalError) as caught:
        H.haystack_tokens(tok, str(empty), 100)
    assert str(caught.value) == f"haystack corpus '{empty}' holds no text"


def test_two_queried_keys_are_joined_by_and():
    from dataclasses import replace

    two = replace(preset("magic-number-multiquery"), keys=2)
    sample = H.make_sample(two, np.random.default_rng(0))
    first, second = (n.split(" for ")[1].split(" is")[0] for n in sample.needles[:2])
    assert sample.question == two.question.format(keys=f"{first} and {second}")


def test_the_forced_answer_of_two_values_follows_the_prompt_text(tok):
    from dataclasses import replace

    two = replace(preset("magic-number-multivalue"), values_per_key=2)
    ids, _ = H.haystack_tokens(tok, "filler", 4000)
    b = H.PromptBuilder(tok, two, ids, chat_template=False)
    orders = set()
    for seed in range(12):
        sample = H.make_sample(two, np.random.default_rng(seed))
        p = b.build(800, 50.0, sample, np.random.default_rng(seed), 12)
        first, second = sorted(range(2), key=lambda i: p.needle_spans[i][0])
        in_text = H.Sample(
            sample.needles, 2, sample.question, sample.answer_prefix, (sample.answers[first], sample.answers[second])
        )
        assert p.answer_ids == b.answer_ids(in_text)
        orders.add(first)
    assert orders == {0, 1}  # the drawn order was the text's order in some prompts and reversed in others


def test_a_record_haystack_reads_the_text_field_asked_for(tmp_path, tok):
    records = tmp_path / "hay.jsonl"
    records.write_text(json.dumps({"body": "Alpha beta.", "text": "not this"}) + "\n")
    ids, info = H.haystack_tokens(tok, str(records), 100, text_field="body")
    assert ids.tolist() == _enc(tok, "Alpha beta.") + _enc(tok, "\n\n") and info["documents"][0]["tokens"] == len(
        _enc(tok, "Alpha beta.")
    )
