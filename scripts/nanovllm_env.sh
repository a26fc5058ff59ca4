#!/usr/bin/env bash
# Scratch copies of nano-vllm's block manager, one per modelled commit, for
# tests/differential/test_designs_fidelity.py (our model of it against its own code, same sequences).
# nano-vllm is not on PyPI, so the source comes from git.
#
#   bash scripts/nanovllm_env.sh                  # both commits: bb823b3 (main) and 2f352ae
#   bash scripts/nanovllm_env.sh bb823b3          # one
#   NANO_VLLM_SRC=/tmp/nanovllm-src .venv/bin/python -m pytest -q tests/differential/test_designs_fidelity.py
#
# Each commit's files land in $NANO_VLLM_SRC/<commit>/ (7-digit name): nanovllm/engine/
# block_manager.py, nanovllm/engine/sequence.py and nanovllm/sampling_params.py (which
# sequence.py imports). The test loads them by path, so the package's own __init__ (torch,
# transformers, flash-attn) never runs. Their imports, xxhash and numpy, are in the repo's .venv.
#
# Where from: NANO_VLLM_GIT, a local clone or bare mirror of github.com/GeeeekExplorer/nano-vllm
# that holds the commits (2f352ae is the head of pull request #132: a mirror with refs/pull/*
# has it); otherwise a clone from GitHub (fetching refs/pull/132/head too). A commit whose files
# are already in place is kept.
#
# Environment: NANO_VLLM_SRC (default /tmp/nanovllm-src), NANO_VLLM_GIT (optional), PYTHON (the
# interpreter that runs the tests, default the repo's .venv).
set -euo pipefail

declare -A FULL=(
    [bb823b3]=bb823b3e06983d71485a8e1f23715ebd87d98ef8
    [2f352ae]=2f352aea436c1d8c49a6c15f67b40bb32c0c2a8c
)
SRC="${NANO_VLLM_SRC:-/tmp/nanovllm-src}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FILES="nanovllm/engine/block_manager.py nanovllm/engine/sequence.py nanovllm/sampling_params.py"
COMMITS=("$@")
[ ${#COMMITS[@]} -gt 0 ] || COMMITS=(bb823b3 2f352ae)

ready() {  # $1: a commit's directory
    for f in $FILES; do [ -s "$1/$f" ] || return 1; done
    grep -q "class BlockManager" "$1/nanovllm/engine/block_manager.py"
}

GIT="${NANO_VLLM_GIT:-}"
cleanup() { [ -n "${CLONE:-}" ] && rm -rf "$CLONE"; return 0; }
trap cleanup EXIT
for c in "${COMMITS[@]}"; do
    full="${FULL[$c]:-}"
    [ -n "$full" ] || { echo "commit $c is not modelled (choose: ${!FULL[*]})" >&2; exit 1; }
    dir="$SRC/$c"
    ready "$dir" && { echo "nano-vllm $c: in place in $dir"; continue; }
    if [ -z "$GIT" ]; then
        CLONE="$(mktemp -d)"
        if ! git clone -q --bare https://github.com/GeeeekExplorer/nano-vllm "$CLONE" 2>/dev/null \
            || ! git -C "$CLONE" fetch -q origin "+refs/pull/132/head:refs/pull/132/head"; then
            echo "could not clone github.com/GeeeekExplorer/nano-vllm (no network?)." >&2
            echo "Set NANO_VLLM_GIT to a local clone or mirror that holds $full." >&2
            exit 1
        fi
        GIT="$CLONE"
    fi
    git -C "$GIT" cat-file -e "$full^{commit}" 2>/dev/null \
        || { echo "$GIT does not hold nano-vllm commit $full" >&2; exit 1; }
    for f in $FILES; do
        mkdir -p "$dir/$(dirname "$f")"
        git -C "$GIT" show "$full:$f" >"$dir/$f"
    done
    ready "$dir" || { echo "$dir does not hold nano-vllm's BlockManager" >&2; exit 1; }
    echo "nano-vllm $c: $dir (from $GIT)"
done
PY="${PYTHON:-$HERE/.venv/bin/python}"
"$PY" -c "import numpy, xxhash" \
    || { echo "$PY lacks numpy or xxhash (nano-vllm's imports)" >&2; exit 1; }
echo "run:  NANO_VLLM_SRC=$SRC $PY -m pytest -q $HERE/tests/differential/test_designs_fidelity.py"
