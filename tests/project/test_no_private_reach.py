"""kvcore is read, never reached into: the lab (every module under paged_kv_lab/) touches no
private attribute or method that kvcore defines; what it needs to see goes through kvcore's
public names and its read-only view, kvcore/core/kv_cache_inspect.py.

kvcore's private names are read from its code (no module is imported): ``self._x = ...``
(plain, annotated or augmented), ``def _x`` (methods and module functions) and class-level
``_x`` (dunders are not private). The lab must not use one as ``obj._x``, in
``getattr``/``hasattr``/``setattr``/``delattr(obj, "_x")``, or import it
(``from kvcore... import _x``), unless ``obj`` is ``self``, ``cls`` or ``super()``: a class's
own state. Nor does the lab walk kvcore's structures itself (the free queue's links, the
managers' per-request maps, the prefix-cache maps: ``WALKED_IN_KVCORE``): kv_cache_inspect walks
each once. Tests may keep poking kvcore's internals; the lab may not.
"""

import ast
from pathlib import Path

from support.paths import ROOT

KVCORE = ROOT / "kvcore"
LAB = ROOT / "paged_kv_lab"
OWN = ("self", "cls")  # ... and super()
NAMED_ACCESS = ("getattr", "hasattr", "setattr", "delattr")
# Public in vLLM, but the structures behind them are walked in kvcore/core/kv_cache_inspect.py
# alone: the free queue (its sentinels and links), each KV cache group's manager and its
# request -> blocks maps, and the prefix cache's maps.
WALKED_IN_KVCORE = {
    "free_block_queue",
    "fake_free_list_head",
    "fake_free_list_tail",
    "next_free_block",
    "prev_free_block",
    "get_all_free_blocks",
    "iter_blocks_after",
    "single_type_managers",
    "req_to_blocks",
    "num_cached_block",
    "cached_block_hash_to_block",
    "cached_block_hashes_by_block",
}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_names(sources: dict[str, str]) -> set[str]:
    """The private attribute and method names the given sources (path -> code) define."""
    names: set[str] = set()
    for code in sources.values():
        for node in ast.walk(ast.parse(code)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(node.name):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for t in ast.walk(target):  # tuple targets: self._a, self._b = ...
                        if (
                            isinstance(t, ast.Attribute)
                            and isinstance(t.value, ast.Name)
                            and t.value.id == "self"
                            and _private(t.attr)
                        ):
                            names.add(t.attr)
            elif isinstance(node, ast.ClassDef):
                for stmt in node.body:
                    targets = (
                        stmt.targets
                        if isinstance(stmt, ast.Assign)
                        else [stmt.target]
                        if isinstance(stmt, ast.AnnAssign)
                        else []
                    )
                    for target in targets:
                        for t in ast.walk(target):
                            if isinstance(t, ast.Name) and _private(t.id):
                                names.add(t.id)
    return names


def _own(obj: ast.expr) -> bool:
    """``self``, ``cls`` or ``super()``: the class's own state."""
    if isinstance(obj, ast.Name):
        return obj.id in OWN
    return isinstance(obj, ast.Call) and isinstance(obj.func, ast.Name) and obj.func.id == "super"


def reaches(code: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, what) for each use of one of ``names`` on something other than the class's own
    state, and each import of one from kvcore."""
    found = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Attribute) and node.attr in names and not _own(node.value):
            found.append((node.lineno, ast.unparse(node)))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in NAMED_ACCESS
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in names
            and not _own(node.args[0])
        ):
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "kvcore":
            for alias in node.names:
                if _private(alias.name):
                    found.append((node.lineno, f"from {node.module} import {alias.name}"))
    return found


def _sources(root: Path) -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for p in sorted(root.rglob("*.py"))}


KVCORE_PRIVATE = private_names(_sources(KVCORE))


def test_kvcore_private_names_are_read_from_its_code():
    # a few that the lab used to read, and the three ways a private name is defined
    assert {"_lazy_mode", "_cache", "_maybe_evict_cached_block", "_null_block"} <= KVCORE_PRIVATE
    assert not any(n.startswith("__") for n in KVCORE_PRIVATE)
    planted = """
class Pool:
    _registry = {}
    _limit: int = 3

    def __init__(self):
        self._free, self._used = [], 0
        self._count: int = 0
        self._count += 1

    def _evict(self):
        pass

def _helper():
    pass
"""
    assert private_names({"x.py": planted}) == {
        "_registry",
        "_limit",
        "_free",
        "_used",
        "_count",
        "_evict",
        "_helper",
    }


def test_the_checker_finds_a_planted_reach():
    names = {"_lazy_mode", "_cache", "_evict"}
    planted = """
from kvcore.core.block_pool import _private_helper
from paged_kv_lab.run.budget import _env_int

class Reader:
    def __init__(self, manager):
        self._cache = {}                            # its own: fine
        self.lazy = manager._lazy_mode              # a reach
        self.n = len(manager.pool.cached._cache)    # a reach

    def go(self, pool):
        super()._evict()                            # its own: fine
        self._cache.clear()                         # its own: fine
        getattr(pool, "_cache")                     # a reach
        getattr(self, "_cache")                     # its own: fine
        return pool._other, pool.__class__          # not kvcore's / a dunder: fine
"""
    got = sorted(reaches(planted, names))
    assert got == [
        (2, "from kvcore.core.block_pool import _private_helper"),
        (8, "manager._lazy_mode"),
        (9, "manager.pool.cached._cache"),
        (14, "getattr(pool, '_cache')"),
    ]


def test_the_lab_reaches_into_no_private_state_of_kvcore():
    found = [
        f"{path}:{line}: {what}"
        for path, code in _sources(LAB).items()
        for line, what in reaches(code, KVCORE_PRIVATE)
    ]
    assert not found, (
        "the lab reads kvcore's private state (read it through kvcore's public names or "
        "kvcore/core/kv_cache_inspect.py; if the name is the lab's own, rename it):\n"
        + "\n".join(found)
    )


def test_the_lab_walks_no_structure_of_kvcore_itself():
    found = [
        f"{path}:{line}: {what}"
        for path, code in _sources(LAB).items()
        for line, what in reaches(code, WALKED_IN_KVCORE)
    ]
    assert not found, (
        "the lab walks kvcore's structures itself (ask kvcore/core/kv_cache_inspect.py, which "
        "walks each once):\n" + "\n".join(found)
    )
