"""--backend vllm refuses what vLLM cannot apply as ctxeval does before vLLM is imported (issue 39): the refusal comes
from ctxeval's math and the model's config.json in the time the config takes to read, not after vLLM's 10-17 s
import with vLLM's log line above it. Every test here blocks `import vllm` (installed or not): a refusal that still
needed vLLM would read "needs vLLM" instead.

The CLI tests go through cli/run.py's Measurement.run, whose check_vllm calls models.vllm_engine.preflight before the
model loads."""

import builtins
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from ctxeval.cli import app, run
from ctxeval.cli.lm_eval import LmEval
from ctxeval.cli.needle import Haystack
from ctxeval.cli.ruler import Ruler
from ctxeval.models.load import load_hf_config
from ctxeval.models.vllm_rope import default_lengths

NEEDS_VLLM = "--backend vllm needs vLLM"
# the tiny model has 16 rotary pairs and was trained at 128 tokens
LONGROPE = f"longrope:factor=4,short_factor={';'.join(['1.0'] * 16)},long_factor={';'.join(['2.0'] * 16)}"
RULER = ["ruler", "--model", "tiny", "--tasks", "niah_single_1", "--backend", "vllm"]


@pytest.fixture
def no_vllm(monkeypatch):
    real = builtins.__import__

    def without(name, *args, **kwargs):
        if name == "vllm" or name.startswith("vllm."):
            raise ImportError("No module named 'vllm'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without)


def invoke(args, tmp_path):
    return CliRunner().invoke(app, args + ["--out", str(tmp_path / "run")])


FIVE = {  # issue 39: the five refusals that came only after vLLM's import (10-17 s)
    "dynamic-ntk at two lengths": (
        RULER + ["--lengths", "512,1024", "-m", "dynamic-ntk:factor=4"],
        "dynamic-ntk(factor=4) on vLLM: vLLM computes one base per engine",
    ),
    "yarn past L x s": (
        RULER + ["--lengths", "512,1024", "-m", "yarn:factor=4"],
        "vLLM's YaRN table holds original length x factor = 512 positions and this run needs 1,024 (",
    ),
    "longrope across L": (
        [
            "passkey",
            "--protocol",
            "yarn",
            "--model",
            "tiny",
            "--lengths",
            "128,256",
            "-m",
            LONGROPE,
            "--backend",
            "vllm",
        ],
        "measure lengths <= 128 and longer ones",
    ),
    "the paper's yarn": (RULER + ["--lengths", "512", "-m", "yarn:factor=4,ramp=ratio"], "use ramp=index"),
    "passkey at L": (
        ["passkey", "--protocol", "yarn", "--model", "tiny", "--lengths", "128", "-m", LONGROPE, "--backend", "vllm"],
        "this run's sequences reach 139 tokens",
    ),
    # no --lengths: 32, 64, 128 and 256 (passkey's multiples of 128); the prompt may leave out the short ones, never
    # 256, and the yarn protocol's reply reaches 11 tokens past it
    "yarn past L x s, default lengths": (
        ["passkey", "--protocol", "yarn", "--model", "tiny", "-m", "yarn:factor=1.5", "--backend", "vllm"],
        "holds original length x factor = 192 positions and this run needs 267",
    ),
}


@pytest.mark.parametrize("case", list(FIVE))
def test_a_method_vllm_cannot_apply_is_refused_without_vllm(case, tmp_path, no_vllm):
    args, message = FIVE[case]
    result = invoke(args, tmp_path)
    assert result.exit_code == 2, result.output
    assert message in result.stderr and NEEDS_VLLM not in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.strip().endswith("--backend hf")
    assert not (tmp_path / "run").exists()


def test_lm_eval_refuses_the_papers_yarn_without_vllm(tmp_path, no_vllm):
    pytest.importorskip("lm_eval")
    tasks = Path(__file__).resolve().parents[2] / "examples" / "lm-eval-tasks"
    args = ["lm-eval", "--tasks", "ctxeval_first_word", "--include-path", str(tasks), "--backend", "vllm"]
    result = invoke(args + ["-m", "yarn:factor=4,ramp=ratio"], tmp_path)
    assert result.exit_code == 2 and "use ramp=index" in result.stderr and NEEDS_VLLM not in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        RULER + ["--lengths", "256,512", "-m", "yarn:factor=4", "-m", "pi"],
        RULER + ["--lengths", "512", "-m", "dynamic-ntk:factor=4"],
        # default lengths 32..256: the needle prompt may leave the short ones out, and 256 alone runs on vLLM, so
        # the check before the import lets it through (the plan after the load decides on the lengths kept)
        ["needle", "--model", "tiny", "--backend", "vllm", "-m", LONGROPE],
        ["needle", "--model", "tiny", "--backend", "vllm", "-m", "dynamic-ntk:factor=4"],
        # RULER picks default lengths its prompts fit (the tokenizer's to say): decided after the load
        RULER + ["-m", "yarn:factor=2"],
    ],
)
def test_what_the_check_before_the_import_cannot_refuse_gets_as_far_as_vllms_import(args, tmp_path, no_vllm):
    result = invoke(args, tmp_path)
    assert result.exit_code == 2 and NEEDS_VLLM in result.stderr, result.stderr


def test_the_default_lengths_before_the_load_are_the_runs():
    """vllm_rope.default_lengths (the config alone) keeps cli/run.py's default_lengths rule (a loaded model), which
    needle and passkey take as it is; RULER and lm-eval choose their default lengths themselves (prompts that fit,
    --max-length), so the check before the load gets no lengths for them (only the length-independent refusals)."""
    config = load_hf_config("tiny")
    loaded = SimpleNamespace(model=None, config=config, name="tiny")
    multiples = Haystack.default_multiples
    assert default_lengths(config, "tiny", multiples) == run.default_lengths(loaded, multiples) == [32, 64, 128, 256]
    assert Haystack.default_lengths is run.Measurement.default_lengths
    assert Ruler.default_lengths is not run.Measurement.default_lengths
    assert LmEval.default_lengths is not run.Measurement.default_lengths
