"""`ctxeval ruler` as a user runs it: rows per sample, RULER-format prompts in the run directory, resume, prompts
read from RULER-written files, batched generation equal to one prompt at a time, one-line errors."""

import json

import pytest
import torch
from helpers import tiny_llama
from typer.testing import CliRunner

from ctxeval.cli import app
from ctxeval.evals.ruler.run import RulerRunner

runner = CliRunner()


TASKS = "niah_single_1,niah_multikey_3,vt,fwe"


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "rows.jsonl").read_text().splitlines() if line.strip()]


def _ruler(out, *extra):  # the bundled tiny model: RULER's prompts need a real tokenizer's lengths
    return runner.invoke(
        app,
        [
            "ruler",
            "--model",
            "tiny",
            "--tasks",
            TASKS,
            "--lengths",
            "1k",
            "--samples",
            "2",
            "--device",
            "cpu",
            "--out",
            str(out),
            *extra,
        ],
    )


def test_a_run_writes_rows_prompts_and_tables_and_resumes(tmp_path):
    out = tmp_path / "run"
    result = _ruler(out, "-m", "dynamic-ntk")  # generation under a length-dependent method: RoPE frozen at 1k
    assert result.exit_code == 0, result.output
    rows = _rows(out)
    assert len(rows) == 4 * 2 and {r["ruler_task"] for r in rows} == set(TASKS.split(","))
    for r in rows:
        assert r["task"] == "ruler" and r["metric"] == "score" and r["value"] == r["score"]
        assert 0 <= r["score"] <= 1 and r["prompt_tokens"] <= 1024 and isinstance(r["outputs"], list)
    samples = [
        json.loads(line) for line in (out / "samples" / "1024" / "vt" / "validation.jsonl").read_text().splitlines()
    ]
    assert [s["index"] for s in samples] == [0, 1]
    assert {"input", "outputs", "length", "answer_prefix"} <= set(samples[0])
    assert samples[0]["answer_prefix"].startswith(" Answer: According to the chain(s) of variable assignment")
    niah = (out / "samples" / "1024" / "niah_single_1" / "validation.jsonl").read_text().splitlines()
    assert all(isinstance(json.loads(line)["token_position_answer"], int) for line in niah)  # niah.py's field
    assert "token_position_answer" not in samples[0]  # RULER writes it for niah only
    table = (out / "table.md").read_text()
    assert "effective length (> 85.6)" in table and "## 1k: score by task" in table and "niah_multikey_3" in table
    assert (out / "heatmap-dynamic-ntk.png").is_file() and (out / "ruler.csv").is_file()

    # resume: a deleted row and a failed row are measured again, nothing else
    kept = [r for r in rows if not (r["ruler_task"] == "vt" and r["sample"] == 1)]
    failed = {**kept.pop(0), "status": "oom", "score": None, "value": None}  # this point ran out of memory
    (out / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [*kept, failed]))
    assert _ruler(out, "-m", "dynamic-ntk").exit_code == 0
    again = _rows(out)[len(kept) + 1 :]
    assert sorted((r["label"], r["ruler_task"], r["sample"]) for r in again) == sorted(
        [("dynamic-ntk", "vt", 1), (failed["label"], failed["ruler_task"], failed["sample"])]
    )


def test_prompts_from_ruler_files(tmp_path):
    source = tmp_path / "ruler-data"
    for task in TASKS.split(","):
        path = source / "1024" / task / "validation.jsonl"
        path.parent.mkdir(parents=True)
        records = [
            {
                "index": 7,
                "input": f"Remember: the code is {n}42.\nWhat is the code?",
                "outputs": [f"{n}42"],
                "length": 30,
                "answer_prefix": " The code is",
            }
            for n in range(3)
        ]  # RULER's niah repeats index
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "run"
    result = _ruler(out, "--samples-from", str(source))
    assert result.exit_code == 0, result.output
    rows = _rows(out)
    assert len(rows) == 4 * 2 and sorted({r["sample"] for r in rows}) == [0, 1]  # --samples 2 of the 3
    assert {tuple(r["outputs"]) for r in rows} == {("042",), ("142",)}

    (source / "1024" / "vt" / "validation.jsonl").write_text('{"input": "x"}\n')
    result = _ruler(tmp_path / "bad", "--samples-from", str(source))
    assert result.exit_code == 2 and "line 1 is not a RULER sample" in result.stderr
    assert len([line for line in result.stderr.splitlines() if line.startswith("error:")]) == 1
    (source / "1024" / "vt" / "validation.jsonl").unlink()
    result = _ruler(tmp_path / "missing", "--samples-from", str(source))
    assert result.exit_code == 2 and "is missing" in result.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--tasks", "niah_single_9"], "unknown task 'niah_single_9'"),
        (["--tasks", "litm:kvv"], "unknown task 'litm:kvv'"),
        (["--tasks", "litm:kv", "--depths", "0,150"], "depths are percentages in 0..100, got 150"),
        (["--tasks", "infbench:passkey", "--kv-pairs", "20"], "--kv-pairs applies to the key-value tasks"),
        (["--tasks", "litm:kv", "--kv-pairs", "0"], "--kv-pairs must be at least 1, got 0"),
        (["--tasks", "litm:kv", "--kv-pairs", "400", "--lengths", "1k"], "400 key-value pairs take"),
        (
            ["--tasks", "infbench:math_find", "--lengths", "32"],
            "shorter than the smallest prompt of infbench:math_find",
        ),
        (["--samples", "0"], "--samples must be >= 1, got 0"),
        (["--threshold", "120"], "--threshold must be in (0, 100], got 120.0"),
        (["--tasks", "niah_single_2", "--lengths", "256"], "--lengths 256 is shorter than the smallest prompt of"),
        (["--template", "llama-chat"], "unknown RULER model template 'llama-chat'"),
        (["--tasks", "cwe", "--cwe-words", "/nonexistent/words"], "--cwe-words /nonexistent/words: cannot read it"),
    ],
)
def test_bad_input_is_one_line(tmp_path, args, message):
    result = runner.invoke(app, ["ruler", "--model", "tiny", "--device", "cpu", "--out", str(tmp_path / "r"), *args])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in result.output


def test_a_chat_template_wraps_every_prompt_and_is_recorded(tmp_path):
    out = tmp_path / "chat"
    result = runner.invoke(
        app,
        [
            "ruler",
            "--model",
            "tiny",
            "--tasks",
            "niah_single_1,vt",
            "--lengths",
            "1k",
            "--samples",
            "1",
            "--template",
            "meta-chat",
            "--device",
            "cpu",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    for task in ("niah_single_1", "vt"):
        sample = json.loads((out / "samples" / "1024" / task / "validation.jsonl").read_text())
        assert sample["input"].startswith("[INST] ") and sample["input"].endswith(" [/INST]")
    record = json.loads((out / "run.json").read_text())
    assert record["spec"]["template"] == "meta-chat" and record["protocol"]["template"] == "meta-chat"
    assert "model template: meta-chat" in (out / "table.md").read_text()


def test_batched_generation_equals_one_at_a_time():
    from transformers import AutoTokenizer

    from ctxeval.util.paths import TINY_MODEL_DIR

    tok = AutoTokenizer.from_pretrained(str(TINY_MODEL_DIR))
    model = tiny_llama(vocab_size=len(tok))
    prompts = ["The grass is green. " * 3 + "What is it?", "Short one.", "The sky is blue. " * 6 + "Answer:"]
    run = RulerRunner(model, tok, "cpu", "tiny")
    one = [run.predict([p], 12) for p in prompts]
    assert run.predict(prompts, 12) == ([texts[0] for texts, _ in one], [n[0] for _, n in one])
    assert [n[0] for _, n in one] == [len(tok(p)["input_ids"]) for p in prompts]  # padding is not counted


def test_essays_read_as_rulers_download_script_writes_them(tmp_path):
    from ctxeval.cli.ruler import essay_text
    from ctxeval.errors import CtxevalError

    (tmp_path / "PaulGrahamEssays.json").write_text(json.dumps({"text": "How to start. It is hard."}))
    assert essay_text(tmp_path / "PaulGrahamEssays.json", "pydoc") == (
        "How to start. It is hard.",
        "PaulGrahamEssays.json",
    )
    essays = tmp_path / "essays"
    essays.mkdir()
    (essays / "b.txt").write_text("Second.")
    (essays / "a.txt").write_text("First. ")
    assert essay_text(essays, "pydoc")[0] == "First. Second."  # sorted, concatenated as RULER's JSON is built
    text, source = essay_text(None, "pydoc")
    assert "substitute" in source and len(text) > 10_000
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(CtxevalError, match="not RULER's PaulGrahamEssays.json"):
        essay_text(tmp_path / "bad.json", "pydoc")


def test_qa_files_download_from_rulers_urls_or_fail_in_one_line(tmp_path, monkeypatch):
    from evals.ruler.qa_files import write_qa_files

    from ctxeval.evals.ruler import generate as R

    monkeypatch.setenv("CTXEVAL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(R.QA_URLS, "squad.json", [f"file://{tmp_path}/nowhere/squad.json"])  # unreachable
    args = ["ruler", "--model", "tiny", "--tasks", "qa_1", "--lengths", "4k", "--samples", "1", "--device", "cpu"]
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "offline")])
    assert result.exit_code == 2 and "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "squad.json (qa_1) needs the network" in lines[0] and "--qa-data DIR" in lines[0]
    assert not list((tmp_path / "cache").rglob("*.json")) and not list((tmp_path / "cache").rglob("*.part"))

    served = tmp_path / "served"
    served.mkdir()
    write_qa_files(served)
    monkeypatch.setitem(
        R.QA_URLS, "squad.json", [f"file://{tmp_path}/nowhere/squad.json", f"file://{served}/squad.json"]
    )
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "online")])
    assert result.exit_code == 0, result.output
    cached = tmp_path / "cache" / "ruler-qa" / "squad.json"
    assert cached.read_bytes() == (served / "squad.json").read_bytes()  # the second URL answered
    spec = json.loads((tmp_path / "online" / "run.json").read_text())["spec"]
    assert spec["qa_data"] == str(cached.parent) and set(spec["qa_sha256"]) == {"squad.json"}
    assert [r["ruler_task"] for r in _rows(tmp_path / "online")] == ["qa_1"]


def test_qa_tasks_with_rulers_files(tmp_path):
    from evals.ruler.qa_files import write_qa_files

    qa = tmp_path / "qa"
    qa.mkdir()
    write_qa_files(qa)
    out = tmp_path / "run"
    result = runner.invoke(
        app,
        [
            "ruler",
            "--model",
            "tiny",
            "--tasks",
            "qa_1,qa_2",
            "--lengths",
            "4k",
            "--samples",
            "1",
            "--qa-data",
            str(qa),
            "--device",
            "cpu",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    rows = _rows(out)
    assert sorted(r["ruler_task"] for r in rows) == ["qa_1", "qa_2"]
    assert {r["metric_fn"] for r in rows} == {"string_match_part"}


def test_ruler_generation_under_dynamic_methods_uses_the_rope_of_the_tasks_length(tmp_path):
    """`ctxeval ruler` with dynamic NTK and dynamic YaRN on the bundled tiny model (trained on 128 tokens), fwe at 256
    and 512 tokens (50 tokens generated after prompts of about 200 and 440): every forward of the generation, the
    prompt's and each new token's, must use the RoPE run.json records for the task's length (docs/ruler.md,
    Inference: "keep the RoPE of the task's length for the prompt and every generated token"). Without the freeze
    a dynamic method recomputes it from the sequence's length, which differs at every step: the prompt's forward alone
    would use the RoPE of ~200 tokens, and the cached keys would disagree with the new queries."""
    from ctxeval.util.paths import TINY_MODEL_DIR

    hidden = json.loads((TINY_MODEL_DIR / "config.json").read_text())["hidden_size"]
    forwards = []  # (tokens in this forward, inv_freq, attention scaling) of every rotary call on hidden states

    def probe(module, args, output):
        # the rotary module's own read-back feeds it a (1, 3, rotary_dim) dummy: only the model's forwards count
        if hasattr(module, "inv_freq") and args and args[0].dim() == 3 and args[0].shape[-1] == hidden:
            forwards.append(
                (int(args[0].shape[1]), module.inv_freq.detach().double().clone(), float(module.attention_scaling))
            )

    out = tmp_path / "run"
    hook = torch.nn.modules.module.register_module_forward_hook(probe)
    try:
        result = runner.invoke(
            app,
            [
                "ruler",
                "--model",
                "tiny",
                "--tasks",
                "fwe",
                "--lengths",
                "256,512",
                "--samples",
                "1",
                "--device",
                "cpu",
                "-m",
                "dynamic-ntk",
                "-m",
                "dynamic-yarn",
                "--out",
                str(out),
            ],
        )
    finally:
        hook.remove()
    assert result.exit_code == 0, result.output
    rows = _rows(out)
    assert len(rows) == 4 and all(r["status"] == "ok" for r in rows)
    record = json.loads((out / "run.json").read_text())

    # one generation = a prompt forward (many tokens) then one forward per new token
    generations = []
    for n, inv_freq, scaling in forwards:
        if n > 1:
            generations.append([])
        assert generations, "a one-token forward before any prompt forward"
        generations[-1].append((n, inv_freq, scaling))
    assert len(generations) == 4  # 2 methods x 2 lengths, 1 sample each

    expected = {}  # (label, length) -> the RoPE run.json records at that length
    for label in ("dynamic-ntk", "dynamic-yarn"):
        effective = {e["length"]: e for e in record["methods"][label]["effective"]}
        for length in (256, 512):
            expected[(label, length)] = (
                torch.tensor(effective[length]["inv_freq"], dtype=torch.float64),
                effective[length]["attention_factor"],
            )
    # the four RoPEs differ from each other, so each generation can be told apart by the one it used
    keys = list(expected)
    for i, a in enumerate(keys):
        for b in keys[i + 1 :]:
            assert not torch.allclose(expected[a][0], expected[b][0], rtol=1e-4), (a, b)

    prompt_tokens = {(r["label"], r["length"]): r["prompt_tokens"] for r in rows}
    matched = []
    for steps in generations:
        prompt = steps[0][0]
        assert len(steps) > 1, "the tiny model stopped at once: nothing was generated under the cache"
        first = [k for k in keys if torch.allclose(steps[0][1], expected[k][0], rtol=1e-5)]
        assert first, (
            f"the prompt's forward ({prompt} tokens) used a RoPE that is none of the task lengths' "
            f"{keys}: not frozen at the task's length"
        )
        key = first[0]
        assert prompt_tokens[key] == prompt and prompt < key[1]  # this generation is that point's prompt
        for i, (_n, inv_freq, scaling) in enumerate(steps):
            assert torch.allclose(inv_freq, expected[key][0], rtol=1e-5), (
                f"{key}: forward {i} of the generation ({prompt} prompt tokens + {i} generated) used another RoPE "
                f"than the task's length {key[1]}: max rel diff "
                f"{float(((inv_freq - expected[key][0]).abs() / expected[key][0]).max()):.3g}"
            )
            assert scaling == pytest.approx(expected[key][1], rel=1e-6), (key, i, scaling)
        matched.append(key)
    assert sorted(matched) == sorted(keys)


def test_a_length_too_short_for_any_asked_task_is_refused_before_the_run_directory(tmp_path):
    """Issue 39: 128 failed on niah_single_1 after the run directory was made, then 512 on niah_single_2: one task at
    a time. Every asked task is checked at once, the shortest length that fits all of them is named, and it fits."""
    out = tmp_path / "r"
    args = ["ruler", "--model", "tiny", "--device", "cpu", "--tasks", "fwe,vt", "--samples", "2", "--out", str(out)]
    result = runner.invoke(app, [*args, "--lengths", "128,1k"])
    assert result.exit_code == 2 and not out.exists()
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert "--lengths 128 is shorter than the smallest prompt of fwe (" in line and "vt (" in line
    shortest = int(line.split("fits all 2 asked tasks is ")[1].split(":")[0].replace(",", ""))
    assert 250 <= shortest < 1024  # vt's smallest prompt on this tokenizer is ~860 tokens
    too_short = runner.invoke(app, [*args, "--lengths", str(shortest - 1)])
    assert too_short.exit_code == 2 and "is shorter than the smallest prompt of vt" in too_short.stderr
    fits = runner.invoke(app, [*args, "--lengths", str(shortest)])
    assert fits.exit_code == 0, fits.output


def test_default_lengths_on_tiny_fit_the_asked_tasks_and_say_what_tiny_cannot_do(tmp_path):
    """The trained length's multiples (128, 256, 512) that fwe's 250-token prompts fit; tiny's note up front."""
    out = tmp_path / "r"
    result = runner.invoke(
        app, ["ruler", "--model", "tiny", "--device", "cpu", "--tasks", "fwe", "--samples", "1", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "note: default lengths 256, 512 (not 128, 256, 512, multiples of the trained length)" in result.stderr
    assert "cannot answer RULER's tasks" in result.stderr
    assert json.loads((out / "run.json").read_text())["spec"]["lengths"] == [256, 512]


def test_retrieval_tasks_run_with_their_depths_and_draw_the_depth_figures(tmp_path):
    """The retrieval tasks go through RULER's runner: rows carry the asked depth and the size, a task without depth
    has none, the run records --depths, and the depth table and figures are written; a rerun measures nothing."""
    out = tmp_path / "r"
    args = ["ruler", "--model", "tiny", "--device", "cpu", "--out", str(out), "--lengths", "1k", "--samples", "1"]
    args += ["--tasks", "infbench:passkey,infbench:math_find", "--depths", "0,100"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = _rows(out)
    passkey = sorted((r["sample"], r["depth"]) for r in rows if r["ruler_task"] == "infbench:passkey")
    assert passkey == [(0, 0.0), (1, 100.0)]
    (math,) = [r for r in rows if r["ruler_task"] == "infbench:math_find"]
    assert "depth" not in math and math["size"] > 10 and math["metric_fn"] == "infbench"
    assert json.loads((out / "run.json").read_text())["spec"]["depths"] == [0.0, 100.0]
    assert (out / "depth-infbench-passkey.png").is_file() and (out / "depth-heatmap-infbench-passkey.png").is_file()
    assert "infbench:passkey: score by depth" in (out / "table.md").read_text()
    again = runner.invoke(app, args)
    assert again.exit_code == 0 and "0 points measured" in again.output + again.stderr
