"""RULER's prompts and scoring (ctxeval/evals/ruler/generate.py) against RULER's specification and its own scripts' output.

The golden samples below were written by RULER's scripts/data/synthetic/niah.py and variable_tracking.py (seed 42,
tokenizer_type hf with the bundled tiny model's tokenizer, max_seq_length 1024), through benchmarks/ruler_parity.py,
which compares every field of every sample for all 11 offline tasks."""

from __future__ import annotations

import hashlib
import json
import re

import pytest
from evals.ruler.qa_files import write_qa_files
from transformers import AutoTokenizer

from ctxeval.data.offline import held_out_documents
from ctxeval.errors import CtxevalError
from ctxeval.evals.ruler import generate as R
from ctxeval.evals.ruler.sources import Sources, Stream
from ctxeval.evals.ruler.tasks import TASKS
from ctxeval.evals.ruler.words import FreqWords
from ctxeval.report import tables as T
from ctxeval.util.paths import TINY_MODEL_DIR


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(str(TINY_MODEL_DIR))


@pytest.fixture(scope="module")
def sources():
    essay = "\n\n".join(text for _, text in held_out_documents())
    return R.Sources(essay_words=re.sub(r"\s+", " ", essay).split(" "), essay_source="pydoc")


def count(tok, text):
    return len(tok.tokenize(text))


def test_samples_equal_rulers_own_scripts(tok, sources):
    niah = R.generate("niah_single_1", 1024, 3, tok, sources)
    assert [(s.outputs, s.length) for s in niah] == [(["8090293"], 987), (["4612365"], 990), (["7374122"], 987)]
    assert niah[0].answer_prefix == " The special magic number for wandering-age mentioned in the provided text is"
    vt = R.generate("vt", 1024, 2, tok, sources)
    assert [(s.outputs, s.length) for s in vt] == [
        (["BIDZE", "LSOCY", "RDAJO", "LBJYZ", "BJRRJ"], 993),
        (["JBMFX", "JVWFR", "KHBUJ", "NRVIA", "WGPZA"], 996),
    ]


# sha256 (first 32 hex digits) of json.dumps of the two samples' [{input, outputs, length, answer_prefix,
# token_position_answer}] that generate(task, length, 2, tok, sources) writes; benchmarks/ruler_parity.py found these
# exact samples identical to what RULER's own scripts (c3f5e3b) write for the same configuration, field by field
# (benchmarks/results/ruler_parity-tiny-tokenizer-2-samples.txt). A change to any prompt, answer or length fails here.
RULER_DIGESTS = [
    ("niah_single_1", 1024, "fe3b4eb0415df4f44c64812801eda4d4"),
    ("niah_multikey_2", 1024, "a093596c113ae206ef21f9916a42618a"),
    ("niah_multikey_3", 1024, "b3289b89765c86663a7c4a376d6492f2"),
    ("vt", 1024, "25d5bcd2308d34559f15d626e401e082"),
    ("fwe", 1024, "c9777d979615105209fc16c4e5f851db"),
    ("cwe", 2048, "2c0722a0a0ea9d9a82c7f35a9d963668"),
    ("cwe", 4096, "aa5a874b33f079697ffa4dee245d0774"),  # from 4k on, cwe's other repeat counts
    ("niah_single_2", 4096, "3d308b68265ed45295ebfc20b1c88ccd"),
    ("niah_single_3", 4096, "7b360ae40993d275bcc0de9c81ee9d38"),
    ("niah_multikey_1", 4096, "6e56499e3c2e42a499bccd93102e2e42"),
    ("niah_multivalue", 4096, "e2666cae9b504f363c5b8969c0f0a038"),
    ("niah_multiquery", 4096, "1f7338e724268625bc530f94b305e27f"),
]


@pytest.mark.parametrize("task, length, digest", RULER_DIGESTS, ids=[f"{t}-{n}" for t, n, _ in RULER_DIGESTS])
def test_every_offline_task_writes_the_samples_rulers_own_scripts_write(tok, sources, task, length, digest):
    fields = ("input", "outputs", "length", "answer_prefix", "token_position_answer")
    records = [{f: s.record().get(f) for f in fields} for s in R.generate(task, length, 2, tok, sources)]
    assert hashlib.sha256(json.dumps(records).encode()).hexdigest()[:32] == digest


def test_niah_samples_carry_rulers_token_position_answer(tok, sources):
    # RULER c3f5e3b, scripts/data/synthetic/niah.py lines 277-282 (written out here, not ctxeval's code): the answer
    # prefix split off the input (model template included) by its first 10 characters, then
    #   index = input_text.find(answer[0])
    #   token_position_answer = len(TOKENIZER.text_to_tokens(input_text[:index]))   # HF: tokenizer.tokenize
    # and line 290 writes it last in the record.
    for task, template in (
        ("niah_single_1", "base"),
        ("niah_multikey_2", "base"),
        ("niah_multikey_3", "meta-chat"),
        ("niah_multiquery", "base"),
    ):
        for sample in R.generate(
            task, 1024 if task != "niah_multiquery" else 4096, 2, tok, sources, model_template=template
        ):
            record = sample.record()
            index = record["input"].find(record["outputs"][0])
            assert index > 0 and record["token_position_answer"] == len(tok.tokenize(record["input"][:index])), task
            assert list(record)[-1] == "token_position_answer"
    # what RULER's niah.py itself wrote for these samples (the golden ones above; run as benchmarks/ruler_parity.py
    # runs it)
    assert [s.record()["token_position_answer"] for s in R.generate("niah_single_1", 1024, 3, tok, sources)] == [
        394,
        395,
        149,
    ]
    # niah.py alone writes it: variable_tracking.py, common_words_extraction.py, freq_words_extraction.py, qa.py do not
    for task in ("vt", "fwe"):
        assert "token_position_answer" not in R.generate(task, 1024, 1, tok, sources)[0].record()


def test_templates_wording_and_formats(tok, sources):
    single = R.generate("niah_single_1", 1024, 1, tok, sources)[0]
    assert single.input.startswith(
        "A special magic number is hidden within the following text. Make sure to "
        "memorize it. I will quiz you about the number afterwards.\n"
    )
    assert re.fullmatch(r"\d{7}", single.outputs[0])
    key = re.search(r"for (\S+) mentioned", single.answer_prefix).group(1)
    adjective, noun = key.split("-", 1)
    words = R.Sources()
    assert adjective in words.wonderwords("adjective") and noun in words.wonderwords("noun")
    assert f"One of the special magic numbers for {key} is: {single.outputs[0]}." in single.input
    multi = R.generate("niah_multiquery", 4096, 1, tok, sources)[0]  # plural wording, Oxford comma
    assert multi.input.startswith("Some special magic numbers are hidden")
    assert multi.answer_prefix.startswith(" The special magic numbers for ") and multi.answer_prefix.endswith(" are")
    assert re.search(r"for \S+, \S+, \S+, and \S+ mentioned", multi.answer_prefix) and len(multi.outputs) == 4
    uuids = R.generate("niah_multikey_3", 1024, 1, tok, sources)[0]
    uuid = r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"
    assert re.fullmatch(uuid, uuids.outputs[0]) and re.search(f"for {uuid} mentioned", uuids.answer_prefix)


def test_the_length_holds_and_the_search_is_tight(tok, sources):
    for task, length in (
        ("niah_single_1", 1024),
        ("niah_multikey_2", 1024),
        ("vt", 1024),
        ("cwe", 2048),
        ("fwe", 1024),
    ):
        for sample in R.generate(task, length, 2, tok, sources):
            ttg = R.FAMILIES[R.TASKS[task].family].tokens_to_generate
            assert sample.length == count(tok, sample.prompt) + ttg <= length, task
    # the binary search returns the largest size that fits: one more unit would overflow
    fits = lambda text: len(text) <= 1000  # noqa: E731
    size = R._search(lambda n: ("ab" * n, []), fits, 5, 10_000)
    assert fits("ab" * size) and not fits("ab" * (size + 1))


def test_needles_sit_between_sentences_and_on_their_own_lines(tok, sources):
    essay = R.generate("niah_multikey_1", 4096, 1, tok, sources)[0]
    needles = re.findall(r"One of the special magic numbers for \S+ is: \d{7}\.", essay.input)
    assert len(needles) == 4
    for needle in needles:
        before = essay.input[: essay.input.index(needle)]
        assert before.endswith("\n") or before.rstrip().endswith((".", "?", "!", ":", '"', "'", ")")), before[-40:]
    noise = R.generate("niah_single_1", 1024, 1, tok, sources)[0]
    lines = noise.input.split("\n")
    assert sum(line.startswith("One of the special magic numbers") for line in lines) == 1
    assert all(line in (R.NOISE,) or line.startswith(("One of", "A special", "What is")) for line in lines)


def test_cwe_and_fwe_answers(tok, sources):
    cwe = R.generate("cwe", 2048, 1, tok, sources)[0]
    listed = re.findall(r"\d+\. (\S+)", cwe.input.split("\n")[-2])  # the last numbered list: the question's
    assert len(cwe.outputs) == 10 and all(listed.count(w) == 6 for w in cwe.outputs)  # < 4k: 6 repeats
    assert cwe.input.count("Question: What are the 10 most common words") == 2  # one few-shot example first
    fwe = R.generate("fwe", 1024, 1, tok, sources)[0]
    words = fwe.input.split(" ")
    counts = {w: words.count(w) for w in fwe.outputs}
    assert len(fwe.outputs) == 3 and counts[fwe.outputs[0]] >= counts[fwe.outputs[1]] >= counts[fwe.outputs[2]]


def test_scoring_gives_partial_credit():
    refs = ["1234567", "7654321", "1111111", "2222222"]
    assert R.score("string_match_all", " 1234567 and 7654321.", refs) == 0.5
    assert R.score("string_match_part", "it is 7654321", refs) == 1.0
    assert R.score("string_match_all", "ABC", ["abc"]) == 1.0  # case-insensitive, as RULER's
    assert R.postprocess("  ans\x00wer\t ") == "ans\nwer"
    rows = [
        {"model": "m", "label": "none", "ruler_task": t, "length": 1024, "sample": i, "status": "ok", "score": v}
        for t, values in (("a", [1.0, 0.5, 0.0]), ("b", [1.0, 1.0, 0.75]))
        for i, v in enumerate(values)
    ]
    scores = T.ruler_task_scores(rows)
    assert list(scores["score"]) == [50.0, 91.67]  # the mean x 100, rounded to 2 decimals
    assert T.ruler_means(scores, ["a", "b"])["mean"].tolist() == [pytest.approx(70.835)]
    assert T.ruler_means(scores, ["a", "b", "c"])["mean"].isna().all()  # a task not scored: no mean
    assert T.ruler_effective_length({1024: 90.0, 2048: 86.0, 4096: 85.6, 8192: 99.0}, 85.6) == 2048  # must exceed


def test_bad_input(tok, sources):
    with pytest.raises(CtxevalError, match="unknown RULER task"):
        R.generate("niah_single_9", 1024, 1, tok, sources)
    with pytest.raises(CtxevalError, match="shorter than the task's smallest prompt"):
        R.generate("niah_single_2", 1024, 1, tok, sources)  # RULER's own script loops forever here
    with pytest.raises(CtxevalError, match="essay haystack"):
        R.generate("niah_single_2", 4096, 1, tok, R.Sources())


def test_qa_tasks_read_rulers_files(tok, tmp_path):
    sources = R.Sources(qa_dir=write_qa_files(tmp_path))
    squad = R.generate("qa_1", 4096, 3, tok, sources)
    assert [s.length for s in squad] == [4067, 4067, 4067]  # RULER's qa.py: the same
    assert squad[0].answer_prefix == " Answer:" and squad[0].input.startswith(
        "Answer the question based on the given documents."
    )
    assert "Question: Which word comes fourth in paragraph 0-0?" in squad[0].input
    assert "Document 1:\n" in squad[0].input and "Unanswerable" not in squad[0].input  # impossible ones skipped
    hotpot = R.generate("qa_2", 4096, 3, tok, sources)
    assert [s.length for s in hotpot] == [3402, 3383, 3389]
    assert all(f"Title {i}-0\n" in s.input for i, s in enumerate(hotpot))  # the gold paragraphs are in
    assert R.score("string_match_part", f"it is {hotpot[0].outputs[0]}", hotpot[0].outputs) == 1.0
    with pytest.raises(CtxevalError, match="pass --qa-data"):
        R.generate("qa_1", 4096, 1, tok, R.Sources())
    with pytest.raises(CtxevalError, match="fewer than --samples 50"):
        R.generate("qa_1", 4096, 50, tok, sources)


def test_model_templates_wrap_the_task_as_prepare_py_does(tok, sources):
    # RULER's scripts/data/template.py, written out here independently of ctxeval's copy
    assert R.MODEL_TEMPLATES["meta-chat"] == "[INST] {task_template} [/INST]"
    assert R.MODEL_TEMPLATES["meta-llama3"] == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n"
        "{task_template}<|eot_id|><|start_header_id|>assistant"
        "<|end_header_id|>\n\n"
    )
    assert len(R.MODEL_TEMPLATES) == 11 and R.MODEL_TEMPLATES["base"] == "{task_template}"
    niah = R.generate("niah_single_1", 1024, 1, tok, sources, model_template="meta-chat")[0]
    assert niah.input.startswith("[INST] A special magic number is hidden") and niah.input.endswith("? [/INST]")
    assert niah.answer_prefix.startswith(" The special magic number for ")  # the prefix follows the wrapper
    assert niah.length == count(tok, niah.prompt) + 128 <= 1024  # the wrapper's tokens count toward the length
    base = R.generate("niah_single_1", 1024, 1, tok, sources)[0]
    assert niah.length > base.length and niah.input[len("[INST] ") :].startswith(base.input[:200])
    vicuna = R.generate("niah_single_1", 1024, 1, tok, sources, model_template="vicuna-chat")[0]
    assert "polite answer to the user's questions" in vicuna.input  # prepare.py's singular rewrite hits the wrapper
    vt = R.generate("vt", 1024, 1, tok, sources, model_template="meta-chat")[0]
    # the few-shot example is built without the wrapper and sits right after "[INST] "
    assert vt.input.startswith("[INST] Memorize and track") and vt.input.count("[INST]") == 1
    assert vt.input.count("Memorize and track the chain(s)") == 2
    cwe = R.generate("cwe", 2048, 1, tok, sources, model_template="meta-chat")[0]
    assert cwe.input.count("[INST]") == 2  # the few-shot example keeps the wrapper (cwe formats it with the template)
    with pytest.raises(CtxevalError, match="unknown RULER model template 'llama'"):
        R.generate("niah_single_1", 1024, 1, tok, sources, model_template="llama")


def test_cwe_words_past_wonderwords(tok, tmp_path, monkeypatch):
    listed = tmp_path / "american-english"
    listed.write_text(
        "Aaron\napple\ndog's\ncafé\napple\nzebra\n"
        + "".join(
            f"w{chr(97 + i)}{chr(97 + j)}{chr(97 + k)}\n" for i in range(26) for j in range(26) for k in range(26)
        )
    )
    words, source = R.english_words(listed)
    assert words[:2] == ["apple", "zebra"] and len(words) == 2 + 26**3  # lowercase a-z, once each, in file order
    assert source.startswith("american-english (17,578 words, sha256 ")
    as_json = tmp_path / "english_words.json"
    as_json.write_text('{"0": "Zed", "1": "apple", "2": "apple"}')
    assert R.english_words(as_json)[0] == ["Zed", "apple", "apple"]  # RULER's JSON: its values, as RULER reads them
    for bad, message in ((tmp_path / "missing.txt", "cannot read it"), (tmp_path / "empty.txt", "holds no words")):
        if "empty" in bad.name:
            bad.write_text("Aaron\n")
        with pytest.raises(CtxevalError, match=message):
            R.english_words(bad)
    # a word list shorter than the length needs: cwe draws from the extra list, as RULER switches to its JSON
    few = {"noun": ["cat", "dog", "owl"], "adjective": ["red", "big"], "verb": ["run", "sit"]}
    monkeypatch.setattr(R.Sources, "wonderwords", lambda self, kind: few[kind])
    short = R.Sources()
    with pytest.raises(CtxevalError, match="more than wonderwords' 7; give a longer list with --cwe-words"):
        R.generate("cwe", 1024, 1, tok, short)
    short.extra_words, short.extra_words_source = words, source
    cwe = R.generate("cwe", 2048, 1, tok, short)[0]
    assert set(cwe.outputs) <= set(words) and cwe.length <= 2048
    assert len(set(re.findall(r"\d+\. (\S+)", cwe.input.split("\n")[-2]))) > 7


def test_samples_read_from_ruler_files_keep_token_position_answer(tmp_path):
    """--samples-from: the run's copy of RULER's niah samples keeps niah.py's token_position_answer."""
    from ctxeval.evals.ruler.run import read_samples

    path = tmp_path / "validation.jsonl"
    records = [
        {
            "index": 5,
            "input": "a 42 b",
            "outputs": ["42"],
            "length": 9,
            "answer_prefix": " A:",
            "token_position_answer": 17,
        },
        {"index": 6, "input": "c 43 d", "outputs": ["43"], "length": 9, "answer_prefix": " A:"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    first, second = read_samples(path, "niah_single_1", 1024)
    assert first.record()["token_position_answer"] == 17
    assert "token_position_answer" not in second.record()


def test_fwe_at_the_shortest_length_it_accepts_fills_it(tmp_path):
    """fwe's smallest length (250 tokens here) is measured, and its prompt reaches the length, not 93 tokens."""
    from ctxeval.evals.ruler.generate import generate
    from ctxeval.evals.ruler.sources import Sources
    from ctxeval.models.load import load_model

    tok = load_model("tiny", device="cpu").tokenizer
    sample = generate("fwe", 320, 2, tok, Sources())
    assert all(250 < s.length <= 320 for s in sample)
    assert all(answer in s.input for s in sample for answer in s.outputs)
    with pytest.raises(CtxevalError, match="shorter than the task's smallest prompt"):
        generate("fwe", 249, 1, tok, Sources())


def test_an_essay_that_cannot_grow_the_prompt_is_refused_not_measured_short():
    from ctxeval.evals.ruler.generate import generate
    from ctxeval.evals.ruler.sources import Sources
    from ctxeval.models.load import load_model

    tok = load_model("tiny", device="cpu").tokenizer
    with pytest.raises(CtxevalError, match=r"the essay haystack \(blank\) cannot fill 2048 tokens"):
        generate(
            "niah_single_2",
            2048,
            1,
            tok,
            Sources(essay_words=["", ""], essay_source="blank", _wonderwords={"keys": ["able-cat", "big-dog"]}),
        )


def test_the_size_search_returns_the_largest_fitting_size_in_the_range_else_the_start():
    from ctxeval.evals.ruler import generate as R

    probes = []

    def make(n):
        probes.append(n)
        return "ab" * n, []

    assert R._search(make, lambda text: len(text) <= 1000, 5, 10_000) == 500
    assert len(probes) <= 14  # bisection: about log2(10_000) probes
    assert R._search(make, lambda text: len(text) <= 1000, 5, 500) == 500  # the upper bound itself fits
    assert R._search(make, lambda text: len(text) <= 1000, 500, 500) == 500
    assert R._search(make, lambda text: len(text) <= 1000, 499, 499) == 499
    assert R._search(make, lambda text: len(text) <= 1000, 501, 600) == 501  # none fits: the start
    assert R._search(make, lambda text: len(text) <= 1000, 7, 8) == 8
    assert R._search(make, lambda text: len(text) <= 14, 7, 8) == 7
    assert R._search(make, lambda text: False, 7, 7) == 7


def test_the_size_search_refuses_a_haystack_that_never_fills_the_prompt():
    from ctxeval.errors import CtxevalError
    from ctxeval.evals.ruler import generate as R

    make = lambda n: ("same text whatever the size", [])  # noqa: E731 (an empty essay file)
    with pytest.raises(CtxevalError) as exc:
        R._search(make, lambda text: True, 5, 400, unfilled=lambda: "the essays are empty")
    assert str(exc.value) == "the essays are empty"
    assert R._search(make, lambda text: True, 5, 400) == 400  # without `unfilled`, the upper bound
    assert R._search(lambda n: ("ab" * n, []), lambda t: len(t) <= 10, 1, 400, unfilled=lambda: "x") == 5


@pytest.mark.parametrize(
    "family, expected", [("niah", 750), ("variable_tracking", 750), ("common_words_extraction", 500)]
)
def test_the_search_bound_is_three_times_the_size_the_length_needs_twice_for_cwe(family, expected):
    from ctxeval.evals.ruler import generate as R

    calls = []

    def make(n):
        calls.append(n)
        return "x" * (4 * n), []  # 4 tokens per unit

    count = len
    assert R._upper(make, count, 1000, 64, 10, family) == expected  # 1000 tokens need 250 units
    assert calls == [64]
    assert R._upper(make, count, 1000, 64, 600, family) == 1200  # never under two steps


def test_the_search_bound_rounds_as_ruler_does():
    from ctxeval.evals.ruler import generate as R

    make = lambda n: ("x" * (3 * n), [])  # noqa: E731 (3 tokens per unit: 1000 / 3 = 333.3 units)
    assert R._upper(make, len, 1000, 10, 1, "niah") == 1000  # int(333.33 x 3)
    assert R._upper(make, len, 1000, 10, 1, "common_words_extraction") == 666  # int(1000 // 3) x 2


def test_postprocess_strips_and_turns_every_control_character_into_a_newline():
    from ctxeval.evals.ruler.generate import postprocess

    assert postprocess(" \n a\x01b\x1fc d\x7f \t") == "a\nb\nc d\x7f"
    assert postprocess("x\x00\x00y") == "x\n\ny"
    assert postprocess("\x00 answer \x1f") == "answer"


def test_score_all_is_the_share_found_and_part_is_any_found_case_insensitively():
    from ctxeval.evals.ruler.generate import score

    refs = ["Alpha", "beta", "GAMMA", "delta"]
    assert score("string_match_all", "ALPHA and Gamma", refs) == 0.5
    assert score("string_match_all", "alpha beta gamma delta", refs) == 1.0
    assert score("string_match_all", "nothing", refs) == 0.0
    assert score("string_match_part", "only gamma here", refs) == 1.0
    assert score("string_match_part", "nothing", refs) == 0.0
    assert score("string_match_all", "beta", ["beta"]) == 1.0 and score("string_match_part", "b", ["beta"]) == 0.0


def test_fwe_too_short_for_four_coded_words_names_the_template_and_the_length_it_needs():
    from transformers import AutoTokenizer

    from ctxeval.evals.ruler import generate as R
    from ctxeval.util.paths import TINY_MODEL_DIR

    tok = AutoTokenizer.from_pretrained(str(TINY_MODEL_DIR))
    with pytest.raises(CtxevalError) as err:
        R.generate("fwe", 240, 1, tok, R.Sources())
    assert str(err.value) == (
        "fwe: length 240 is shorter than the task's smallest prompt (RULER's coded vocabulary of "
        "(length - 50) // 50 words needs 4, and the template alone is 158 tokens with this "
        "tokenizer); use --lengths of at least 250"
    )
    assert len(R.generate("fwe", 250, 1, tok, R.Sources())) == 1


# Issue 27: loops that a bug (or a mutant) could turn infinite end with an error instead of hanging. Each test
# forces the loop's way out shut (a draw that repeats itself, a count that never grows) and expects the bound's
# RuntimeError within a second; the correct loops never reach the bounds (the RULER and passkey tests pass).


def test_an_fwe_prompt_that_stops_growing_is_refused_after_a_bounded_number_of_tries():
    """The growth loop ends at its ceiling on the word count (and, were the count stuck, at its iteration bound):
    the one-line refusal, never a hang."""
    from ctxeval.errors import CtxevalError
    from ctxeval.evals.ruler.generate import _fwe_samples

    fwe = FreqWords(TASKS["fwe"], Sources(), Stream(42), 4096)
    calls = []

    def text(vocab, num_words):
        calls.append(num_words)
        return "a b c", ["a", "b", "c"]  # never longer, whatever the word count

    fwe.text = text
    with pytest.raises(CtxevalError, match="the prompt stops growing at 3 tokens, short of the 4096-token length"):
        _fwe_samples(TASKS["fwe"], 4096, 1, lambda s: len(s.split()), fwe)
    assert len(calls) <= 4 * fwe.budget // max(fwe.budget // 32, 1) + 3
