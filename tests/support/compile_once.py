"""Bytecode for the checkout, written once by the xdist controller before its workers start
(tests/conftest.py: ``compile_once_for_the_workers``).

A fresh clone has no ``__pycache__``: every worker would compile the same modules of kvcore, the
lab and tests/support, and rewrite the same test modules' asserts (pytest caches a test module's
rewritten code in its own ``*-pytest-*.pyc``), all at the same moment, so each of them pays the
whole cost. Written once here, the workers read them. Both steps are cheap where the bytecode is
current (a stat, or a read of the cached rewritten file, per module)."""

from __future__ import annotations

import compileall
from pathlib import Path

from support.paths import ROOT, TESTS

PACKAGES = (ROOT / "kvcore", ROOT / "paged_kv_lab", TESTS / "support")


def modules_to_rewrite(folder: Path = TESTS) -> list[Path]:
    """The files pytest rewrites the asserts of: its ``python_files`` (``test_*.py``, the
    default) and every ``conftest.py``."""
    return sorted(
        p
        for p in folder.rglob("*.py")
        if (p.name.startswith("test_") or p.name == "conftest.py") and "__pycache__" not in p.parts
    )


def compile_packages(folders=PACKAGES) -> None:
    """Plain bytecode for the checkout's packages, as an import writes it."""
    for folder in folders:
        compileall.compile_dir(str(folder), quiet=2, workers=1)


def rewrite_test_modules(config, files: list[Path]) -> list[Path]:
    """The rewritten bytecode of each of ``files`` that has none yet (or a stale one), written where
    pytest's import hook reads it; returns the files rewritten now. Nothing is written when
    asserts are not rewritten (``--assert=plain``) or this pytest lacks the hook's parts (then
    each worker rewrites them itself, as before)."""
    try:
        from _pytest.assertion import rewrite
    except ImportError:
        return []
    parts = ("assertstate_key", "get_cache_dir", "PYC_TAIL", "_read_pyc", "_rewrite_test")
    if not all(hasattr(rewrite, name) for name in (*parts, "_write_pyc", "try_makedirs")):
        return []
    state = config.stash.get(rewrite.assertstate_key, None)
    if state is None or getattr(state, "mode", "rewrite") != "rewrite":
        return []
    done = []
    for fn in files:
        pyc = rewrite.get_cache_dir(fn) / (fn.name[:-3] + rewrite.PYC_TAIL)
        if rewrite._read_pyc(fn, pyc, state.trace) is not None:
            continue
        source_hash, co = rewrite._rewrite_test(fn, config)
        if rewrite.try_makedirs(pyc.parent) and rewrite._write_pyc(state, co, source_hash, pyc):
            done.append(fn)
    return done
