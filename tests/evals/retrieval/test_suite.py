"""The retrieval tasks as `ctxeval ruler` runs them (ctxeval/evals/retrieval/suite.py): each prompt fills its length
with the tokenizer (the next size would not fit), the answer sits at the asked depth of the same draws, the fixed
counts (HELMET's table, --kv-pairs) are kept or refused, and every reply is scored by its original's rule."""

from __future__ import annotations

import hashlib
import json
import re

import pytest
from transformers import AutoTokenizer

from ctxeval.data.offline import held_out_documents
from ctxeval.errors import CtxevalError
from ctxeval.evals.prompts.sample import RulerSample
from ctxeval.evals.retrieval import helmet_json_kv, infinitebench
from ctxeval.evals.retrieval import suite as S
from ctxeval.evals.ruler import fit
from ctxeval.evals.ruler.run import RulerConfig, read_samples, write_samples
from ctxeval.util.paths import TINY_MODEL_DIR


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(str(TINY_MODEL_DIR))


@pytest.fixture(scope="module")
def prose():
    text = " ".join(text for _, text in held_out_documents())
    return re.sub(r"\s+", " ", text), "pydoc"


def count(tok, text):
    return len(tok.tokenize(text))


@pytest.mark.parametrize("task", sorted(S.SUITE_TASKS))
def test_each_prompt_fills_its_length_and_one_more_unit_would_not_fit(tok, prose, task):
    """Catches a size search that stops short (an off-by-one in the bisection, a probe that never grows) or that
    overshoots (the generation budget left out)."""
    length, depths = 1024, (0.0, 100.0)
    samples = S.generate_suite(task, length, 2, tok, 42, depths, None, prose)
    spec = S.SUITE_TASKS[task]
    sizer = S.Sizer(spec, length, lambda text: count(tok, text), S.prose(spec, prose, tok))
    for number in range(2):
        mine = [s for s in samples if s.index % 2 == number]
        size = mine[0].size
        assert all(s.size == size for s in mine)  # one size at every depth: the same draws
        for s in mine:
            assert s.length == count(tok, s.input) + spec.tokens_to_generate <= length
        seed = S.sample_seed(42, task, length, number)
        used = depths if spec.has_depth else (50.0,)
        assert sizer.total(seed, size + 1, used) > length
    assert len(samples) == (4 if spec.has_depth else 2)
    assert [s.index for s in samples] == list(range(len(samples)))


def test_litm_gold_pair_moves_through_the_same_records(tok):
    """Catches a depth that picks another example (records differ between depths) or an index off by one."""
    samples = S.generate_suite("litm:kv", 1024, 1, tok, 7, (0.0, 50.0, 100.0))
    records = []
    for s in samples:
        data = json.loads(s.input.split("JSON data:\n")[1].split("\n\nKey:")[0])
        key = re.search(r'Key: "([^"]+)"', s.input).group(1)
        keys = list(data)
        assert data[key] == s.outputs[0]
        assert keys.index(key) == round(s.depth / 100 * (len(keys) - 1))
        records.append(sorted(data.items()))
    assert records[0] == records[1] == records[2]


def test_passkey_needle_line_is_the_depth_of_its_noise_lines(tok):
    """Catches the needle put at the depth of the wrong count (lines + 1) or measured from the end."""
    for s in S.generate_suite("infbench:passkey", 1024, 1, tok, 3, (0.0, 25.0, 100.0)):
        before = s.input.split("The pass key is " + s.outputs[0])[0]
        assert before.count(infinitebench.NOISE) == round(s.depth / 100 * s.size)
        assert s.input.count(infinitebench.NOISE) == s.size


def test_helmet_keeps_its_table_and_kv_pairs_fixes_the_count(tok):
    """Catches HELMET's per-length key count ignored, or --kv-pairs ignored or not refused where it cannot fit."""
    samples = S.generate_suite("helmet:json_kv", 4096, 1, tok, 1, (50.0,))
    assert samples[0].size == helmet_json_kv.NUM_KVS_LLAMA2[4096] == 50
    assert S.generate_suite("litm:kv", 1024, 1, tok, 1, (50.0,), kv_pairs=5)[0].size == 5
    with pytest.raises(CtxevalError, match="400 key-value pairs take .* more than --lengths 1,024"):
        S.generate_suite("infbench:kv_retrieval", 1024, 1, tok, 1, (50.0,), kv_pairs=400)


def test_a_length_below_the_smallest_prompt_is_refused_as_ruler_fit_expects(tok):
    """Catches a refusal worded so that ruler.fit no longer sees it (the length check would raise instead of
    naming the shortest length)."""
    assert S.TOO_SHORT == fit.TOO_SHORT
    smallest = S.smallest_suite_prompt("infbench:math_find", tok, 42)
    with pytest.raises(CtxevalError, match=S.TOO_SHORT):
        S.generate_suite("infbench:math_find", smallest - 10, 1, tok, 42)  # an estimate: draws differ
    assert S.generate_suite("infbench:math_find", smallest + 40, 1, tok, 42)


def test_seeds_reproduce_and_differ(tok):
    one = S.generate_suite("infbench:number_string", 512, 2, tok, 5, (50.0,))
    assert one == S.generate_suite("infbench:number_string", 512, 2, tok, 5, (50.0,))
    assert one[0].outputs != S.generate_suite("infbench:number_string", 512, 2, tok, 6, (50.0,))[0].outputs
    assert one[0].outputs != one[1].outputs


def _sample(task, outputs, text="x"):
    return RulerSample(0, text, outputs, 0, "")


@pytest.mark.parametrize(
    "task, outputs, reply, expected",
    [
        ("litm:kv", ["ab12-CD"], " AB12-cd is the value", 1.0),  # case ignored, substring
        ("litm:kv", ["ab12-cd"], " ab12-c", 0.0),
        ("helmet:json_kv", ["a1b2-c3d4"], " a1b2-c3d4\nKey:", 1.0),
        ("helmet:json_kv", ["a1b2-c3d4"], " a1b2", 0.0),
        ("infbench:kv_retrieval", ["ab-12"], ' "ab-12".', 1.0),
        ("infbench:kv_retrieval", ["ab-12"], " ab-123", 0.0),  # a word, not a prefix
        ("infbench:passkey", ["01234"], " 01234. Remember", 1.0),
        ("infbench:passkey", ["01234"], " 1234", 0.0),  # leading zero counts
        ("infbench:number_string", ["1122334455"], " 11223344556", 0.0),  # extra digits
        ("infbench:math_find", ["42"], " 42, 17", 1.0),
        ("infbench:math_find", ["50.5"], " 50.5", 1.0),  # a median
        ("infbench:math_find", ["42"], " 4", 0.0),
    ],
)
def test_replies_are_scored_by_the_originals_rule(task, outputs, reply, expected):
    assert S.score_reply(task, reply, _sample(task, outputs)) == expected


def test_facts_score_reads_the_question_from_the_prompt_and_refuses_every_label(tok, prose):
    """Catches a scorer that ignores the question (a label named in it would then count) or accepts a reply that
    lists every location."""
    sample = S.generate_suite("facts:qa1", 1024, 1, tok, 11, (50.0,), None, prose)[0]
    question, answer = sample.input.rpartition("Question: ")[2], sample.outputs[0]
    assert question.startswith("Where is ")
    assert S.score_reply("facts:qa1", f"The most recent location of X is {answer}.", sample) == 1.0
    every = ", ".join(["bathroom", "bedroom", "garden", "hallway", "kitchen", "office"])
    assert S.score_reply("facts:qa1", every, sample) == 0.0
    qa3_style = RulerSample(0, "...Question: Where was the apple before the kitchen?", ["bathroom"], 0, "")
    assert S.SUITE_TASKS["facts:qa2"].score("Before the kitchen the apple was in the bathroom.", qa3_style) == 1.0


def test_facts_without_prose_are_refused(tok):
    with pytest.raises(CtxevalError, match="needs a background text"):
        S.generate_suite("facts:qa2", 1024, 1, tok, 1)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"tasks": ("litm:kv",), "depths": (0.0, 101.0)}, "--depths 101 is outside 0-100"),
        ({"tasks": ("litm:kv",), "depths": (50.0, 50.0)}, "names a depth twice"),
        ({"tasks": ("infbench:kv",)}, "unknown task 'infbench:kv'"),
        ({"tasks": ("vt",), "kv_pairs": 10}, "--kv-pairs applies to the key-value tasks"),
    ],
)
def test_config_refuses_bad_input(kwargs, message):
    with pytest.raises(CtxevalError, match=message):
        RulerConfig(lengths=(1024,), samples=1, **kwargs)


def test_depth_and_size_survive_the_runs_samples_file(tmp_path, tok):
    """Catches depth or size dropped on the way to validation.jsonl (a resumed run would lose its depth axis)."""
    samples = S.generate_suite("litm:kv", 512, 1, tok, 1, (0.0, 100.0))
    path = tmp_path / "validation.jsonl"
    write_samples(path, samples)
    assert read_samples(path, "litm:kv", 512) == samples
    path.write_text(json.dumps({**samples[0].record(), "depth": 120}) + "\n")
    with pytest.raises(CtxevalError, match="depth is not a number from 0 to 100"):
        read_samples(path, "litm:kv", 512)


def test_math_find_answers_are_its_lists_order_statistics(tok):
    """Catches a prompt whose list is not the one the answer was computed from."""
    for s in S.generate_suite("infbench:math_find", 1024, 4, tok, 9):
        values = [int(v) for v in re.search(r"\[([0-9, ]+)\]", s.input).group(1).split(", ")]
        assert len(values) == s.size
        question = s.input.rpartition("\n\n")[2]
        gold = float(s.outputs[0]) if "." in s.outputs[0] else int(s.outputs[0])
        distinct = sorted(set(values))
        if "median" in question:
            ordered = sorted(values)
            half = len(ordered) // 2
            expected = ordered[half] if len(ordered) % 2 else (ordered[half] + ordered[half - 1]) / 2
        else:
            rank = 2 if "third" in question else 1 if "second" in question else 0
            expected = distinct[-1 - rank] if "largest" in question else distinct[rank]
        assert gold == expected, question


GOLDEN = {  # sha256 (first 16 hex digits) of sample 0's prompt at 512 tokens, seed 42, the tiny tokenizer
    "litm:kv": "6d90c9463b2055f6",
    "infbench:passkey": "cb2ae263389b0fb5",
}


@pytest.mark.parametrize("task", sorted(GOLDEN))
def test_prompts_do_not_drift(tok, task):
    """Catches a change in the draws' order or the prompt text: a resumed or repeated run must meet the same
    prompts (random.Random hashes a str seed with SHA-512, so they hold across processes)."""
    sample = S.generate_suite(task, 512, 1, tok, 42, (50.0,))[0]
    assert hashlib.sha256(sample.input.encode()).hexdigest()[:16] == GOLDEN[task]


def test_a_prompt_that_stops_growing_is_refused_not_searched_forever(tok):
    """Catches the size search doubling without bound when a size adds no tokens."""
    flat = S.SuiteTask("flat", "", 1, "units", 1, lambda rng, size, depth, bg: S.Built("x", ["y"]), S.score_reply)
    with pytest.raises(CtxevalError, match="stops growing below 1,024 tokens"):
        S.Sizer(flat, 1024, lambda text: count(tok, text)).largest("s", (50.0,))
    with pytest.raises(CtxevalError, match="stops growing"):
        S.Sizer(flat, 1024, lambda text: count(tok, text)).adjusted("s", (50.0,), 5)


def test_a_released_prompt_longer_than_its_length_is_refused(tok):
    """Catches an InfiniteBench-size prompt measured at a shorter asked length."""
    from ctxeval.evals.ruler.run import check_fits

    sample = RulerSample(0, "word " * 300, ["1"], -1, "")
    with pytest.raises(CtxevalError, match="takes .* more than --lengths 256"):
        check_fits("infbench:passkey", 256, [sample], tok)
    check_fits("infbench:passkey", 1024, [sample], tok)
