"""The bytecode the xdist controller writes for its workers before they start
(tests/support/compile_once.py): the test modules with their asserts rewritten, where pytest's
import hook reads them, and the packages' plain bytecode; nothing again while it is current."""

import importlib.util
from pathlib import Path

from _pytest.assertion import rewrite

from support.compile_once import compile_packages, modules_to_rewrite, rewrite_test_modules


def test_the_test_modules_are_rewritten_once_where_pytest_reads_them(tmp_path, pytestconfig):
    (tmp_path / "layer").mkdir()
    test = tmp_path / "layer" / "test_x.py"
    test.write_text("def test_a():\n    assert 1 + 1 == 2\n")
    (tmp_path / "conftest.py").write_text("X = 1\n")
    (tmp_path / "layer" / "helper.py").write_text("Y = 2\n")
    files = modules_to_rewrite(tmp_path)
    assert files == [tmp_path / "conftest.py", test]  # a helper is not a test module

    assert rewrite_test_modules(pytestconfig, files) == files
    pyc = rewrite.get_cache_dir(test) / ("test_x" + rewrite.PYC_TAIL)
    co = rewrite._read_pyc(test, pyc)
    assert co is not None and "@pytest_ar" in co.co_names  # the asserts are rewritten
    assert rewrite_test_modules(pytestconfig, files) == []  # current: nothing to do

    test.write_text("def test_a():\n    assert 2 + 2 == 4\n")
    assert rewrite_test_modules(pytestconfig, files) == [test]  # changed: rewritten again


def test_the_packages_get_the_bytecode_an_import_reads(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text("Z = 3\n")
    compile_packages([pkg])
    for name in ("__init__.py", "mod.py"):
        assert Path(importlib.util.cache_from_source(str(pkg / name))).is_file(), name
