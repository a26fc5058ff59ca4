#!/usr/bin/env bash
# A scratch Python environment in which SGLang 0.5.23's own RadixCache imports, on a CPU-only
# machine, for tests/differential/test_designs_fidelity.py (our radix model against SGLang's, same ops).
#
#   bash scripts/sglang_env.sh              # builds /tmp/sglang-venv (idempotent: a ready one is kept)
#   SGLANG_VENV=/tmp/sglang-venv .venv/bin/python -m pytest -q tests/differential/test_designs_fidelity.py
#
# What it installs, and why:
# - the sglang==0.5.23 wheel with --no-deps (its full dependency list pulls GPU kernels, GBs);
# - the packages that the import chain of sglang.srt.mem_cache.radix_cache really needs (found by
#   importing it until nothing was missing: the module imports sglang.srt.utils, which imports
#   transformers, torchvision, triton and more), at the versions SGLang 0.5.23's metadata pins
#   where it names them (torch 2.14.1, torchvision 0.29.1, ...). Only the simulated tree runs: no
#   GPU, no model, no server.
#
# Environment: SGLANG_VENV (where, default /tmp/sglang-venv), SGLANG_WHEEL (a local wheel; default
# the one in /tmp/designs/, else `pip download sglang==0.5.23 --no-deps`), PYTHON (a Python 3.11
# interpreter: the wheel is cp311; default python3.11).
set -euo pipefail

VERSION=0.5.23
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SGLANG_VENV:-/tmp/sglang-venv}"
PYTHON="${PYTHON:-$(command -v python3.11 || true)}"
[ -n "$PYTHON" ] || { echo "needs a python3.11 interpreter (the wheel is cp311); set PYTHON" >&2; exit 1; }

ready() {
    [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -I -c "
import importlib.metadata as m
from sglang.srt.mem_cache.radix_cache import RadixCache
assert m.version('sglang') == '$VERSION', m.version('sglang')
RadixCache.create_simulated(page_size=1)
" >/dev/null 2>&1
}

done_msg() {
    echo "SGLang $VERSION's RadixCache imports in $VENV"
    echo "run:  SGLANG_VENV=$VENV $HERE/.venv/bin/python -m pytest -q $HERE/tests/differential/test_designs_fidelity.py"
}

if ready; then
    done_msg
    exit 0
fi

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PKG=sglang WHEEL_DIR=/tmp/designs
# shellcheck source=scripts/_scratch_env.sh
source "$HERE/scripts/_scratch_env.sh"
install_project "${SGLANG_WHEEL:-}"

# The import chain of radix_cache, at SGLang's own version specifiers where it has one.
NEEDED="torch torchvision triton numpy orjson psutil pybase64 requests packaging pillow starlette
msgspec pydantic pyzmq tqdm ipython aiohttp transformers dill apache-tvm-ffi sentencepiece
compressed-tensors gguf"
mapfile -t SPECS < <(pinned_specs $NEEDED)
[ "${#SPECS[@]}" -gt 0 ] || { echo "could not read SGLang's requirements" >&2; exit 1; }
echo "installing: ${SPECS[*]}"
pip_install "${SPECS[@]}"

if ready; then
    done_msg
else
    echo "sglang.srt.mem_cache.radix_cache still does not import in $VENV:" >&2
    "$VENV/bin/python" -I -c "from sglang.srt.mem_cache.radix_cache import RadixCache" 2>&1 | tail -n 5 >&2
    exit 1
fi
