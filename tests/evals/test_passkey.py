"""`ctxeval passkey --protocol yarn` against transcriptions of jquesnelle/yarn eval/passkey.py: the prompt text, the
length search, no BOS, at most 10 new tokens, the scoring, the refusals, and a run end to end with the bundled model."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from helpers import build_tokenizer, tiny_llama
from typer.testing import CliRunner

from ctxeval.cli import app
from ctxeval.data.presets import load_task
from ctxeval.errors import CtxevalError
from ctxeval.evals import haystack as H
from ctxeval.evals import needle as N
from ctxeval.evals import passkey as P
from ctxeval.tiny import MODEL_DIR

runner = CliRunner()


needs_model = pytest.mark.skipif(not (MODEL_DIR / "model.safetensors").is_file(), reason="no bundled tiny model")


# -- transcriptions of eval/passkey.py (jquesnelle/yarn, HEAD), kept verbatim but for `random`, which the tests drive
class Draws:
    """Stands in for the `random` module: randint(a, b) returns the given `values` in turn (checking that each is in
    a..b), or draws from a numpy generator with both ends included. The prefix draw randint(0, n_garbage) comes first
    in generate_prompt, so `per_prompt(n_garbage)` may pick the generator of each prompt."""

    def __init__(self):
        self.set()

    def set(self, values=None, rng=None, per_prompt=None):
        self.values, self.rng, self.per_prompt = (iter(values) if values is not None else None), rng, per_prompt

    def randint(self, a, b):
        if self.values is not None:
            value = next(self.values)
            assert a <= value <= b
            return value
        if self.per_prompt is not None and a == 0:
            self.rng = self.per_prompt(b)
        return int(self.rng.integers(a, b + 1))


random = Draws()


def generate_prompt(n_garbage):
    """Generates a text file and inserts an execute line at a random position."""
    n_garbage_prefix = random.randint(0, n_garbage)
    n_garbage_suffix = n_garbage - n_garbage_prefix

    task_description = "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. I will quiz you about the important information there."
    garbage = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
    garbage_inf = " ".join([garbage] * 10000)
    assert len(garbage_inf) >= n_garbage
    garbage_prefix = garbage_inf[:n_garbage_prefix]
    garbage_suffix = garbage_inf[:n_garbage_suffix]
    pass_key = random.randint(1, 50000)
    information_line = f"The pass key is {pass_key}. Remember it. {pass_key} is the pass key."
    final_question = "What is the pass key? The pass key is"
    lines = [task_description, garbage_prefix, information_line, garbage_suffix, final_question]
    return "\n".join(lines), pass_key


def repo_lengths(tokenizer, tokens, length_step=128):
    """main()'s search for the character counts (the targets in increasing order, last_n carried over)."""
    lengths = []
    last_n = 0
    for target in tokens:
        num_tokens = 0
        n = last_n
        while num_tokens < target:
            last_n = n
            n += length_step
            prompt = generate_prompt(n)[0]
            num_tokens = len(tokenizer.encode(prompt))
        lengths.append(last_n)
    return lengths


def repo_answer(response):
    """test_model's parse of the reply."""
    try:
        pass_key = int(re.search(r"\d+", response).group())
    except:  # noqa: E722 - verbatim
        pass_key = response[:20]
    return pass_key


# -- fixtures
@pytest.fixture(scope="module")
def tiny_tok():
    """The bundled model's tokenizer: it adds BOS by default, so counting with its defaults differs from without."""
    from transformers import AutoTokenizer

    if not (MODEL_DIR / "tokenizer.json").is_file() and not (MODEL_DIR / "tokenizer_config.json").is_file():
        pytest.skip("no bundled tiny tokenizer")
    return AutoTokenizer.from_pretrained(MODEL_DIR)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def yarn_runner(tokenizer, lengths=(600,), samples=2, model=None, bos=False, seed=0, **cfg):
    builder = P.YarnPasskeyBuilder(tokenizer, seed=seed, bos=bos)
    config = N.NeedleConfig(tuple(lengths), (), samples=samples, random_depth=True, seed=seed, **cfg)
    return P.YarnPasskeyRunner(model, tokenizer, "cpu", builder, config, "tiny", "passkey")


# -- the prompt text
@pytest.mark.parametrize(
    "n_garbage, n_prefix, key",
    [(0, 0, 1), (128, 0, 50000), (128, 128, 7), (1000, 333, 45028), (4096, 4095, 12), (90_000, 45_001, 31337)],
)
def test_the_text_is_generate_prompts(n_garbage, n_prefix, key):
    random.set(values=[n_prefix, key])
    expected, pass_key = generate_prompt(n_garbage)
    assert pass_key == key
    assert P.yarn_prompt_text(n_garbage, n_prefix, key) == expected


def test_a_built_prompt_draws_the_prefix_then_the_key_as_generate_prompt_does(tiny_tok):
    b = P.YarnPasskeyBuilder(tiny_tok)
    for length in (200, 300, 700):
        n = b.garbage_chars(length)
        for seed in range(4):
            sample, depth, prompt = b.build(length, np.random.default_rng(seed))
            random.set(rng=np.random.default_rng(seed))
            text, key = generate_prompt(n)
            assert prompt.text == text and prompt.key == key and sample.answers == (str(key),)
            assert prompt.garbage_chars == n and text.split("\n")[1] == P.garbage(prompt.prefix_chars)
            assert depth == (round(100 * prompt.prefix_chars / n, 2) if n else 0.0)
    assert n > 0


def test_the_recorded_passkey_preset_has_the_repos_strings():
    preset = H.NeedlePreset.from_dict("passkey", load_task("needle-passkey", "needle"))
    assert (preset.instruction, preset.needle.format(value=45028), f"{preset.question} {preset.answer_prefix}") == (
        P.YARN_TASK,
        P.information_line(45028),
        P.YARN_QUESTION,
    )
    assert P.YarnPasskeyBuilder(build_tokenizer()).preset == preset and P.YARN_GARBAGE == H.FILLER


def test_the_filler_continues_past_the_repos_ten_thousand_repetitions():
    long = P.garbage(2_000_000)
    assert len(long) == 2_000_000 and long.startswith(P.garbage(890_000)) and P.garbage(5) == "The g"
    assert long[-200:] in " ".join([P.YARN_GARBAGE] * 3)


# -- the length search
@pytest.mark.parametrize("seed", [0, 3])
def test_the_length_search_is_the_repos_loop(tiny_tok, tok, seed):
    targets = list(range(72, 1400, 13))
    for tokenizer in (tiny_tok, tok):
        b = P.YarnPasskeyBuilder(tokenizer, seed=seed)
        random.set(per_prompt=lambda n: P.search_rng(seed, n))  # the search's seeded draws, per character count
        expected = repo_lengths(tokenizer, [t for t in targets if t > b.search_tokens(0)])
        got = [b.garbage_chars(t) for t in targets if t > b.search_tokens(0)]
        assert got == expected
        assert all(n % 128 == 0 for n in got) and len(set(got)) > 5
        fresh = P.YarnPasskeyBuilder(tokenizer, seed=seed)  # out of order, without the memo: the same result
        assert [fresh.garbage_chars(t) for t in reversed(targets) if t > b.search_tokens(0)] == got[::-1]
    # the search's draws come from --seed, apart from the samples' draws
    assert P.draw(5000, P.search_rng(seed, 5000)) != P.draw(5000, P.search_rng(seed + 1, 5000))
    assert P.draw(5000, P.search_rng(seed, 5000)) != P.draw(5000, np.random.default_rng([seed, 5000, 0, 0]))


def test_the_search_counts_with_the_tokenizers_defaults_and_stays_under_the_target(tiny_tok):
    b = P.YarnPasskeyBuilder(tiny_tok)
    assert tiny_tok.encode("x")[0] == tiny_tok.bos_token_id  # this tokenizer adds BOS by default
    for target in (150, 256, 512, 1000):
        n = b.garbage_chars(target)
        text = P.yarn_prompt_text(n, *P.draw(n, P.search_rng(0, n)))
        assert b.search_tokens(n) == len(tiny_tok.encode(text)) == len(tiny_tok(text)["input_ids"]) < target
        step = P.yarn_prompt_text(n + 128, *P.draw(n + 128, P.search_rng(0, n + 128)))
        assert len(tiny_tok.encode(step)) >= target


def test_a_long_target_is_found_from_an_estimate_in_a_few_tokenizations(tiny_tok):
    class Counting:  # the tokenizer, counting the prompts the search tokenizes
        def __init__(self):
            self.calls, self.bos_token_id = 0, tiny_tok.bos_token_id

        def encode(self, text):
            self.calls += 1
            return tiny_tok.encode(text)

        def __call__(self, text, **kw):
            return tiny_tok(text, **kw)

    counting = Counting()
    b = P.YarnPasskeyBuilder(counting)
    n = b.garbage_chars(100_000)  # the repo steps 2,000 times to get here
    assert b.search_tokens(n) < 100_000 <= b.search_tokens(n + 128) and n % 128 == 0
    assert counting.calls <= 8


def test_a_target_the_prompt_alone_reaches_gets_no_filler_and_the_cli_refuses_it(tiny_tok):
    b = P.YarnPasskeyBuilder(tiny_tok)
    bare = b.search_tokens(0)
    assert b.minimum_length() == bare + 1
    assert b.garbage_chars(bare) == 0 == b.garbage_chars(10)  # as the repo's loop ends
    assert b.garbage_chars(bare + 1) >= 0


# -- tokens, BOS, budget
def test_no_bos_by_default_and_bos_when_asked(tiny_tok):
    rng = lambda: np.random.default_rng(11)  # noqa: E731
    plain = P.YarnPasskeyBuilder(tiny_tok).build(400, rng())[2]
    with_bos = P.YarnPasskeyBuilder(tiny_tok, bos=True).build(400, rng())[2]
    assert plain.ids == tiny_tok(plain.text, add_special_tokens=False)["input_ids"]
    assert tiny_tok.bos_token_id not in plain.ids
    assert with_bos.ids == [tiny_tok.bos_token_id] + plain.ids == tiny_tok(plain.text)["input_ids"]


def test_generation_is_greedy_with_at_most_ten_new_tokens(tiny_tok, monkeypatch):
    model = tiny_llama(vocab_size=len(tiny_tok))
    r = yarn_runner(tiny_tok, (300,), model=model)
    seen = {}
    real = model.generate

    def generate(input_ids, attention_mask, generation_config):
        seen.update(
            new=generation_config.max_new_tokens,
            sample=generation_config.do_sample,
            beams=generation_config.num_beams,
            ids=input_ids[0].tolist(),
        )
        return real(input_ids=input_ids, attention_mask=attention_mask, generation_config=generation_config)

    monkeypatch.setattr(model, "generate", generate)
    item = r.item(300, 0, 0)
    out = r._generate_batch([item], None)[0]
    assert (seen["new"], seen["sample"], seen["beams"]) == (10, False, 1) and seen["ids"] == item.prompt.ids
    assert out["correct"] == int(P.yarn_score(out["response"], item.prompt.key))
    assert yarn_runner(tiny_tok, max_new_tokens=3).budget(item.sample) == 3  # --max-new-tokens still overrides


# -- scoring
@pytest.mark.parametrize(
    "response",
    [
        "45028",
        " 45028.",
        "-45028",
        "045028",
        "no number",
        "",
        " 4502",
        "450280",
        " 12 45028",
        "45028 is",
        " the key is 45,028",
        "\uff14\uff15\uff10\uff12\uff18",
    ],
)
def test_scoring_is_the_repos_parse(response):
    assert P.yarn_score(response, 45028) == (repo_answer(response) == 45028)


def test_the_repos_scoring_differs_from_ctxevals_first_integer():
    preset = H.NeedlePreset.from_dict("passkey", load_task("needle-passkey", "needle"))
    sample = H.Sample(("x",), 1, "q", "", ("45028",))
    for response in ("-45028", "045028"):
        assert P.yarn_score(response, 45028) and not H.score_response(preset, sample, response)
    r = yarn_runner(build_tokenizer())
    assert r.score(sample, " 045028") and not r.score(sample, "no number") and not r.score(sample, " 45027")


# -- runner: seeded prompts, depth, batching, dynamic RoPE
def test_every_method_sees_the_same_seeded_prompts_and_the_resume_depth_is_the_items(tiny_tok):
    a, b = yarn_runner(tiny_tok, (300, 500), samples=3), yarn_runner(tiny_tok, (300, 500), samples=3)
    cells = a.cfg.cells()
    assert [a.item(*c).prompt.ids for c in cells] == [b.item(*c).prompt.ids for c in cells]
    assert [a.depth(c) for c in cells] == [a.item(*c).depth for c in cells]
    assert len({a.item(*c).prompt.key for c in cells}) == len(cells)
    other = yarn_runner(tiny_tok, (300, 500), samples=3, seed=1)
    assert [other.item(*c).prompt.key for c in cells] != [a.item(*c).prompt.key for c in cells]


def test_prompts_of_one_token_count_share_a_generate_call(tiny_tok, monkeypatch):
    from ctxeval.specs import expand_specs

    r = yarn_runner(tiny_tok, (700,), samples=8, batch_size=8)
    items = [r.item(700, 0, s) for s in range(8)]
    sizes = [len(it.prompt.ids) for it in items]
    assert len(set(sizes)) > 1  # the draws move the token count
    calls = []
    monkeypatch.setattr(
        r,
        "_generate_batch",
        lambda chunk, handle: (
            calls.append([len(it.prompt.ids) for it in chunk]),
            [{"correct": 1, "response": "1"}] * len(chunk),
        )[1],
    )
    rows = []
    r.measure(expand_specs(["none"])[0], r.cfg.cells(), rows.extend)
    assert sorted(len(set(c)) for c in calls) == [1] * len(set(sizes))  # one call per token count
    assert sorted(map(len, calls)) == sorted(sizes.count(n) for n in set(sizes))
    assert sorted(r_["sample"] for r_ in rows) == list(range(8))
    assert all(r_["prompt_tokens"] == sizes[r_["sample"]] and r_["protocol"] == "yarn" for r_ in rows)
    assert all(r_["garbage_chars"] == items[0].prompt.garbage_chars for r_ in rows)


def test_a_dynamic_method_is_frozen_at_the_prompt_and_its_budget(tiny_tok, monkeypatch):
    from ctxeval.rope.patching import apply_method

    model = tiny_llama(vocab_size=len(tiny_tok))
    r = yarn_runner(tiny_tok, (300,), model=model)
    item = r.item(300, 0, 0)
    with apply_method(model, "dynamic-ntk", factor=2) as handle:
        frozen = []
        real = handle.freeze_length
        monkeypatch.setattr(handle, "freeze_length", lambda n: (frozen.append(n), real(n))[1])
        r._generate_batch([item], handle)
    assert frozen == [len(item.prompt.ids) + 10, None] and len(item.prompt.ids) < 300


def test_the_runner_refuses_forced_scoring(tiny_tok):
    with pytest.raises(CtxevalError, match="--protocol ctxeval"):
        yarn_runner(tiny_tok, scoring="forced")


# -- CLI
@pytest.mark.parametrize(
    "extra, fragment",
    [
        (["--haystack", "austen"], "--haystack austen"),
        (["--chat-template", "on"], "--chat-template on"),
        (["--chat-template", "auto"], "--chat-template auto"),
        (["--scoring", "forced"], "--scoring forced"),
        (["--protocol", "landmark"], "--protocol must be yarn or ctxeval, got 'landmark'"),
    ],
)
def test_yarn_refuses_what_the_repo_has_not_in_one_line(tmp_path, extra, fragment):
    result = runner.invoke(
        app, ["passkey", "--model", "tiny", "--lengths", "256", "--out", str(tmp_path / "o"), *extra]
    )
    assert result.exit_code == 2, result.output
    assert fragment in result.stderr and "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1
    if "must be" not in fragment:
        assert "--protocol ctxeval" in result.stderr


@needs_model
def test_passkey_yarn_end_to_end(tmp_path, tiny_tok):
    out = tmp_path / "pk"
    args = ["passkey", "--model", "tiny", "--lengths", "256,512", "--samples", "2", "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    run = json.loads((out / "run.json").read_text())
    spec = run["spec"]
    assert (spec["protocol"], spec["bos"], spec["max_new_tokens"], spec["length_step"]) == ("yarn", False, 10, 128)
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert sorted((r["length"], r["sample"]) for r in rows) == [(256, 0), (256, 1), (512, 0), (512, 1)]
    b = P.YarnPasskeyBuilder(tiny_tok)
    for r in rows:
        assert r["prompt_tokens"] < r["length"] and r["status"] == "ok"
        assert r["garbage_chars"] == b.garbage_chars(r["length"]) == run["protocol"]["garbage_chars"][str(r["length"])]
        assert r["correct"] == int(P.yarn_score(r["response"], int(r["answer"])))
        sample, depth, prompt = b.build(r["length"], np.random.default_rng([0, r["length"], 0, r["sample"]]))
        assert (r["prompt_tokens"], r["depth"], r["answer"]) == (len(prompt.ids), depth, sample.answers[0])
    assert (
        "the YaRN paper's figures" in (out / "table.md").read_text()
        and "protocol yarn" in (out / "table.md").read_text()
    )
    again = runner.invoke(app, args)  # resume: nothing measured twice
    assert again.exit_code == 0 and len((out / "rows.jsonl").read_text().splitlines()) == 4
    other = runner.invoke(app, [*args, "--protocol", "ctxeval"])
    assert other.exit_code == 2 and "protocol" in other.stderr and "different spec" in other.stderr


@needs_model
def test_passkey_yarn_defaults_to_twenty_samples_and_bos_is_an_option(tmp_path, tiny_tok):
    out = tmp_path / "pk"
    result = runner.invoke(app, ["passkey", "--model", "tiny", "--lengths", "200", "--bos", "--out", str(out)])
    assert result.exit_code == 0, result.output
    spec = json.loads((out / "run.json").read_text())["spec"]
    assert spec["samples"] == 20 and spec["bos"] is True
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert sorted(r["sample"] for r in rows) == list(range(20))
    plain = P.YarnPasskeyBuilder(tiny_tok)
    for r in rows:  # the same prompts as without --bos, one token longer
        assert r["prompt_tokens"] == len(plain.build(200, np.random.default_rng([0, 200, 0, r["sample"]]))[2].ids) + 1
    ctx = runner.invoke(
        app,
        [
            "passkey",
            "--model",
            "tiny",
            "--lengths",
            "200",
            "--protocol",
            "ctxeval",
            "--max-new-tokens",
            "4",
            "--samples",
            "1",
            "--out",
            str(tmp_path / "c"),
        ],
    )
    assert ctx.exit_code == 0, ctx.output
    cspec = json.loads((tmp_path / "c" / "run.json").read_text())["spec"]
    assert (cspec["protocol"], cspec["bos"], cspec["samples"]) == ("ctxeval", True, 1)
    (crow,) = [json.loads(line) for line in (tmp_path / "c" / "rows.jsonl").read_text().splitlines()]
    assert crow["prompt_tokens"] + 4 == 200 and "protocol" not in crow  # ctxeval's rows as before


def test_out_of_memory_halves_the_generate_batch_then_records_the_length_and_skips_longer_ones(tiny_tok, monkeypatch):
    from ctxeval.evals.common import OomLadder, PointOOM
    from ctxeval.specs import expand_specs

    r = yarn_runner(tiny_tok, (300, 700), samples=4, batch_size=4)
    notes = []
    r.progress = type("P", (), {"note": lambda self, t: notes.append(t), "advance": lambda self, n, text: None})()
    calls = []

    def generate_batch(chunk, handle):
        calls.append((chunk[0].length, len(chunk)))
        if chunk[0].length == 700:
            raise PointOOM("out of memory (injected)")
        return [{"correct": 1, "response": "1"}] * len(chunk)

    monkeypatch.setattr(r, "_generate_batch", generate_batch)
    ladder, rows = OomLadder(), []
    spec = expand_specs(["none"])[0]
    r.measure(spec, r.cfg.cells(), rows.extend, None, ladder)
    assert [(r_["length"], r_["status"]) for r_ in rows] == [(300, "ok")] * 4 + [(700, "oom")] * 4
    assert {r_["note"] for r_ in rows if r_["status"] == "oom"} == {"out of memory (injected)"}
    assert [n for length, n in calls if length == 700][-1] == 1  # given up only once a batch of one ran out
    assert notes == [
        "none: out of memory at 700 tokens; batch size 2",
        "none: out of memory at 700 tokens; batch size 1",
        "none: out of memory at 700 tokens; longer lengths skipped",
    ]
    later = []  # a later work item of the method: that length and longer ones are skipped, nothing generated
    tried = len(calls)
    r.measure(spec, [(700, 0, 0), (900, 0, 1)], later.extend, None, ladder)
    assert [(r_["length"], r_["status"], r_["note"], r_["protocol"]) for r_ in later] == [
        (700, "skipped", "skipped: out of memory at 700 tokens", "yarn"),
        (900, "skipped", "skipped: out of memory at 700 tokens", "yarn"),
    ]
    assert len(calls) == tried


def test_a_passkey_filler_that_stops_growing_stops_the_length_search(monkeypatch):
    from transformers import AutoTokenizer

    from ctxeval.tiny import MODEL_DIR

    builder = P.YarnPasskeyBuilder(AutoTokenizer.from_pretrained(MODEL_DIR))
    monkeypatch.setattr(builder, "search_tokens", lambda chars: 10)  # never reaches the target
    with pytest.raises(RuntimeError, match="stay under 1,000 tokens"):
        builder.garbage_chars(1000)
