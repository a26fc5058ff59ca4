#!/usr/bin/env bash
# A scratch Python environment in which vLLM 0.34.0's own BlockPool imports, on a CPU-only machine,
# for bench/bench_pool_vs_vllm.py (our BlockPool against vLLM's, same op sequence), and its Scheduler
# for scripts/vllm_lookahead_diff.py (tests/differential/test_draft_model_vllm.py: allocations with lookahead),
# and its SimpleCPUOffloadScheduler for bench/offload_vs_vllm.py (tests/differential/test_offload_vs_vllm.py: the
# CPU tier; its import chain needs nothing more).
#
#   bash scripts/vllm_env.sh                 # builds /tmp/vllm034-venv (idempotent: a ready one is kept)
#   VLLM_VENV=/tmp/vllm034-venv .venv/bin/python bench/bench_pool_vs_vllm.py
#
# What it installs, and why so little:
# - the real vllm==0.34.0 wheel with --no-deps (its full dependency list pulls CUDA kernels, GBs);
# - torch==2.13.0 (vllm/__init__ imports torch; this machine has a local CPU build of 2.13.0,
#   vLLM pins 2.14.0 but nothing BlockPool runs touches torch);
# - the packages that the import chain of vllm.v1.core.block_pool really needs (found by importing
#   it until nothing was missing), at the versions vLLM 0.34.0's metadata asks for where it names them;
#   einops for vllm.v1.core.sched.scheduler's chain, xxhash for our own kvcore, which the
#   scheduler comparison imports beside vLLM.
# Nothing else of vLLM (no GPU, no model, no server) is needed or used.
#
# Environment: VLLM_VENV (where, default /tmp/vllm034-venv; vLLM 0.33.0's, from before the move, stays at
# /tmp/vllm-venv), VLLM_WHEEL (a local wheel; default the one in /tmp/vllm034/, else
# `pip download vllm==0.34.0 --no-deps` into it), PYTHON (the interpreter; default
# the base interpreter of the repo's .venv, so both pools run on the same Python build).
set -euo pipefail

VERSION=0.34.0
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VLLM_VENV:-/tmp/vllm034-venv}"
if [ -z "${PYTHON:-}" ]; then
    if [ -x "$HERE/.venv/bin/python" ]; then
        PYTHON="$("$HERE/.venv/bin/python" -c 'import sys; print(sys._base_executable)')"
    else
        PYTHON="$(command -v python3)"
    fi
fi

ready() {
    [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -I -c "
import vllm
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue, KVCacheBlock
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.simple_kv_offload.manager import SimpleCPUOffloadScheduler
assert vllm.__version__ == '$VERSION', vllm.__version__
" >/dev/null 2>&1
}

done_msg() {
    echo "vLLM $VERSION's BlockPool imports in $VENV"
    echo "run:  VLLM_VENV=$VENV $HERE/.venv/bin/python $HERE/bench/bench_pool_vs_vllm.py"
}

if ready; then
    done_msg
    exit 0
fi

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PKG=vllm WHEEL_DIR=/tmp/vllm034
# shellcheck source=scripts/_scratch_env.sh
source "$HERE/scripts/_scratch_env.sh"

# 1. vLLM itself, without its dependencies.
install_project "${VLLM_WHEEL:-}"

# 2. torch: the local CPU build (another spec downloads GBs of CUDA wheels).
"$VENV/bin/python" -c "import torch" 2>/dev/null || pip_install "torch==2.13.0"

# 3. The import chain of vllm.v1.core.block_pool, at vLLM's own version specifiers where it has one.
NEEDED="packaging psutil pyzmq urllib3 regex numpy msgspec pydantic cbor2 transformers aiohttp requests
openai pillow pybase64 cachetools cloudpickle uvloop py-cpuinfo prometheus_client xgrammar fastapi
partial-json-parser llguidance oss-harmony einops xxhash"
mapfile -t SPECS < <(pinned_specs $NEEDED)
[ "${#SPECS[@]}" -gt 0 ] || { echo "could not read vLLM's requirements" >&2; exit 1; }
echo "installing: ${SPECS[*]}"
# oss-harmony (vLLM's name for the openai_harmony module) may be missing from an index; then the
# original openai-harmony provides the same module.
if ! pip_install "${SPECS[@]}"; then
    SPECS=("${SPECS[@]/oss-harmony*/openai-harmony}")
    pip_install "${SPECS[@]}"
fi

if ready; then
    done_msg
else
    echo "vllm.v1.core.block_pool still does not import in $VENV:" >&2
    "$VENV/bin/python" -I -c "import vllm.v1.core.block_pool" 2>&1 | tail -n 5 >&2
    exit 1
fi
