#!/usr/bin/env bash
# A scratch Python environment in which SGLang 0.5.23's own RadixCache imports, on a CPU-only
# machine, for tests/test_designs_fidelity.py (our radix model against SGLang's, same ops).
#
#   bash scripts/sglang_env.sh              # builds /tmp/sglang-venv (idempotent: a ready one is kept)
#   SGLANG_VENV=/tmp/sglang-venv .venv/bin/python -m pytest -q tests/test_designs_fidelity.py
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
    echo "run:  SGLANG_VENV=$VENV $HERE/.venv/bin/python -m pytest -q $HERE/tests/test_designs_fidelity.py"
}

if ready; then
    done_msg
    exit 0
fi

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip_install() {
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@" 2>&1 \
        | { grep -vE "is ignored: it is neither|^sglang $VERSION requires|dependency resolver does not" || true; }
}

if [ "$("$VENV/bin/python" -c "import importlib.metadata as m; print(m.version('sglang'))" 2>/dev/null)" != "$VERSION" ]; then
    WHEEL="${SGLANG_WHEEL:-}"
    if [ -z "$WHEEL" ]; then
        WHEEL="$(ls /tmp/designs/sglang-$VERSION-*.whl 2>/dev/null | head -n1 || true)"
    fi
    if [ -z "$WHEEL" ]; then
        mkdir -p /tmp/designs
        "$VENV/bin/python" -m pip download -q --no-deps -d /tmp/designs "sglang==$VERSION"
        WHEEL="$(ls /tmp/designs/sglang-$VERSION-*.whl | head -n1)"
    fi
    echo "installing $WHEEL (--no-deps)"
    pip_install --no-deps "$WHEEL"
fi

# The import chain of radix_cache, at SGLang's own version specifiers where it has one.
NEEDED="torch torchvision triton numpy orjson psutil pybase64 requests packaging pillow starlette
msgspec pydantic pyzmq tqdm ipython aiohttp transformers dill apache-tvm-ffi sentencepiece
compressed-tensors gguf"
mapfile -t SPECS < <("$VENV/bin/python" - $NEEDED <<'PY'
import importlib.metadata as m
import re
import sys

try:
    from packaging.requirements import Requirement
except ImportError:                                # not installed yet: pip's own copy
    from pip._vendor.packaging.requirements import Requirement

def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()

wanted = {norm(n): n for n in sys.argv[1:]}
pinned = {}
for line in m.requires("sglang") or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue                                   # another platform, or an optional extra
    if norm(req.name) in wanted:
        pinned[norm(req.name)] = f"{req.name}{req.specifier}"
for key, name in wanted.items():
    print(pinned.get(key, name))
PY
)
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
