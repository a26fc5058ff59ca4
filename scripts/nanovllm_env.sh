#!/usr/bin/env bash
# A scratch copy of nano-vllm's block manager for tests/test_designs_fidelity.py (our model of it
# against its own code, same sequences). nano-vllm is not on PyPI, so the source comes from git.
#
#   bash scripts/nanovllm_env.sh           # builds /tmp/nanovllm-src (idempotent: a ready one is kept)
#   NANO_VLLM_SRC=/tmp/nanovllm-src .venv/bin/python -m pytest -q tests/test_designs_fidelity.py
#
# The test needs only nanovllm/engine/block_manager.py and nanovllm/engine/sequence.py (plus
# nanovllm/sampling_params.py, which sequence.py imports); it loads them by path, so the package's
# own __init__ (which imports torch, transformers and flash-attn) never runs. Their imports,
# xxhash and numpy, are already in the repo's .venv.
#
# Where the network reaches GitHub this clones github.com/GeeeekExplorer/nano-vllm at the commit
# our model follows. Where it does not (this project's build machine), put the three files there
# by hand from that commit (e.g. from a copy read with a code-search tool) and rerun: the script
# then only checks them.
#
# Environment: NANO_VLLM_SRC (where, default /tmp/nanovllm-src), NANO_VLLM_COMMIT (default below).
set -euo pipefail

COMMIT="${NANO_VLLM_COMMIT:-2f352aea436c1d8c49a6c15f67b40bb32c0c2a8c}"
SRC="${NANO_VLLM_SRC:-/tmp/nanovllm-src}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FILES="nanovllm/engine/block_manager.py nanovllm/engine/sequence.py nanovllm/sampling_params.py"

ready() {
    for f in $FILES; do [ -f "$SRC/$f" ] || return 1; done
    grep -q "class BlockManager" "$SRC/nanovllm/engine/block_manager.py" \
        && grep -q "def may_append" "$SRC/nanovllm/engine/block_manager.py"
}

if ! ready; then
    if command -v git >/dev/null && git clone -q https://github.com/GeeeekExplorer/nano-vllm "$SRC.clone" 2>/dev/null; then
        git -C "$SRC.clone" checkout -q "$COMMIT"
        rm -rf "$SRC" && mv "$SRC.clone" "$SRC"
    else
        rm -rf "$SRC.clone"
        echo "could not clone github.com/GeeeekExplorer/nano-vllm (no network?)." >&2
        echo "Put $FILES from commit $COMMIT under $SRC by hand, then rerun." >&2
        exit 1
    fi
fi
ready || { echo "$SRC does not hold nano-vllm's BlockManager" >&2; exit 1; }
"$HERE/.venv/bin/python" -c "import numpy, xxhash" \
    || { echo "the repo's .venv lacks numpy or xxhash (nano-vllm's imports)" >&2; exit 1; }
echo "nano-vllm's block manager is in $SRC"
echo "run:  NANO_VLLM_SRC=$SRC $HERE/.venv/bin/python -m pytest -q $HERE/tests/test_designs_fidelity.py"
