# What the scratch-environment scripts (vllm_env.sh, sglang_env.sh) share; sourced, not run.
# The sourcing script sets VENV (the venv's folder), PKG and VERSION (the project whose wheel goes
# in with --no-deps) and WHEEL_DIR (where its wheel is looked for and downloaded to).

# pip, without the noise that is expected here: the project's own dependency list is left out on
# purpose (--no-deps), so pip lists what it "requires"; and this machine's extra indexes warn.
pip_install() {
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@" 2>&1 \
        | { grep -vE "is ignored: it is neither|^$PKG $VERSION requires|dependency resolver does not" || true; }
}

# install_project [WHEEL]: PKG==VERSION without its dependencies, from WHEEL when given, else from
# a wheel already in WHEEL_DIR, else from one downloaded there; nothing when it is installed.
install_project() {
    local wheel="${1:-}"
    if [ "$("$VENV/bin/python" -c "import importlib.metadata as m; print(m.version('$PKG'))" 2>/dev/null)" = "$VERSION" ]; then
        return 0
    fi
    [ -n "$wheel" ] || wheel="$(ls "$WHEEL_DIR/$PKG-$VERSION-"*.whl 2>/dev/null | head -n1 || true)"
    if [ -z "$wheel" ]; then
        mkdir -p "$WHEEL_DIR"
        "$VENV/bin/python" -m pip download -q --no-deps -d "$WHEEL_DIR" "$PKG==$VERSION"
        wheel="$(ls "$WHEEL_DIR/$PKG-$VERSION-"*.whl | head -n1)"
    fi
    echo "installing $wheel (--no-deps)"
    pip_install --no-deps "$wheel"
}

# pinned_specs NAME...: each name, with PKG's own version specifier where its metadata names it.
pinned_specs() {
    "$VENV/bin/python" "$(dirname "${BASH_SOURCE[0]}")/pinned_specs.py" "$PKG" "$@"
}
