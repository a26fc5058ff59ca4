"""Where the tests live (docs/tests.md#where-the-tests-live): each test file in the folder of its
layer, helpers in one package, and no test module importing another.

- tests/kvcore/: the vLLM mirror (block pool, hashing, managers, scheduler, model runner...);
- tests/lab/: the lab's own packages (recording, runs, why, text, player, workloads, fleet,
  designs, classroom, watch, lessons and cases...);
- tests/app/: the pages, driven with AppTest in the test process;
- tests/browser/: the app in a real chromium (Playwright), every module marked ``browser``;
- tests/differential/: the same thing computed by another implementation (vLLM 0.33.0,
  SGLang, nano-vllm, transformers) must agree;
- tests/project/: the repository as a whole (imports, docs, packaging, benchmarks, this file).

What two test modules share lives in tests/support/ (helpers, imported as ``support.<name>``) or
in a conftest.py (fixtures); scripts that a reference environment's own Python runs live in
tests/support/reference/.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

from support.paths import TESTS

LAYERS = ("kvcore", "lab", "app", "browser", "differential", "project")
NOT_TESTS = ("support", "fixtures")  # helpers and data: no test file may sit there


def python_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)


def suite_files() -> list[Path]:
    return [p for p in python_files() if p.name.startswith("test_") or p.name.endswith("_test.py")]


def imported_modules(path: Path) -> set[str]:
    """Every absolute module a file imports (``from x.y import z`` gives ``x.y`` and ``x.y.z``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def test_every_test_file_sits_in_the_folder_of_its_layer():
    misplaced = [
        str(p.relative_to(TESTS))
        for p in suite_files()
        if len(p.relative_to(TESTS).parts) != 2 or p.parent.name not in LAYERS
    ]
    assert not misplaced, f"move each into one of tests/{{{','.join(LAYERS)}}}/: {misplaced}"
    assert {p.parent.name for p in suite_files()} == set(LAYERS), "a layer without tests"


def test_a_layer_folder_holds_test_files_and_its_conftest_only():
    """A helper module beside the tests (``_helpers.py``) would be imported by its basename from
    wherever pytest put that folder on sys.path: helpers go to tests/support/."""
    stray = [
        str(p.relative_to(TESTS))
        for layer in LAYERS
        for p in sorted((TESTS / layer).iterdir())
        if p.suffix == ".py" and not p.name.startswith("test_") and p.name != "conftest.py"
    ]
    assert not stray, f"helpers belong in tests/support/: {stray}"
    assert not list(TESTS.glob("test_*.py")) and not list(TESTS.glob("_*.py"))
    assert (TESTS / "support" / "__init__.py").exists()


def test_no_test_module_imports_another():
    """Shared code in a test module made one test file load (and re-run the set-up of) another;
    it lives in tests/support/ or a conftest.py instead."""
    test_names = {p.stem for p in suite_files()}
    bad = {}
    for path in python_files():
        mods = imported_modules(path)
        wrong = sorted(
            m
            for m in mods
            if m.split(".")[0] in test_names
            or m.split(".")[0] == "tests"
            or m.split(".")[0] == "conftest"
        )
        if wrong:
            bad[str(path.relative_to(TESTS))] = wrong
    assert not bad, bad


def test_test_file_names_are_unique():
    """pytest imports each test file by its basename (tests/ and its folders are no packages), so
    two files of one name in two folders would clash."""
    twice = [n for n, k in Counter(p.name for p in suite_files()).items() if k > 1]
    assert not twice, twice


def test_every_browser_module_is_marked_browser():
    """``-m "not browser"`` (make test-fast) must leave out every test that starts chromium."""
    unmarked = [
        p.name
        for p in suite_files()
        if p.parent.name == "browser" and "pytest.mark.browser" not in p.read_text("utf-8")
    ]
    assert not unmarked, unmarked


def test_the_model_parametrised_fixture_is_defined_once():
    """``loaded`` (the tiny model, and SmolLM2 in the slow set) lives in tests/conftest.py."""
    where = [
        str(p.relative_to(TESTS))
        for p in python_files()
        if any(
            isinstance(n, ast.FunctionDef) and n.name == "loaded"
            for n in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
        )
    ]
    assert where == ["conftest.py"], where


def test_the_checks_catch_a_test_module_importing_another(tmp_path):
    """The import check itself: both spellings of importing a test module are found."""
    f = tmp_path / "test_x.py"
    f.write_text("from test_browser import wait_idle\nfrom tests.test_pd import zen\n")
    assert {"test_browser", "tests.test_pd"} <= imported_modules(f)
