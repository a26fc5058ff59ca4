"""Each choice list is defined once, where its concept lives, and derived everywhere else: hash
algorithms, free orders, scheduling policies and admission rules in kvcore next to where kvcore
uses them, model names (and devices, dtypes) where the models are loaded, routers in the router
module. A second literal copy of any of them anywhere in the code, the benchmarks, the scripts or
the tests fails here; the docs name every choice."""

import ast
import re

import pytest

from kvcore.config.scheduler import ADMISSIONS
from kvcore.core.block_pool import FREE_ORDERS
from kvcore.core.sched.request_queue import POLICIES
from kvcore.kv_cache_interface import MAMBA_CACHE_MODES
from kvcore.model.shapes import (
    ATTENTION_MODELS,
    DEVICE_CHOICES,
    DTYPE_CHOICES,
    MODEL_CHOICES,
    TINY_MODELS,
)
from kvcore.utils.hashing import HASH_ALGOS, HASH_FUNCTIONS
from paged_kv_lab.fleet.router import policies
from support.paths import ROOT

ROUTERS = policies()

SCANNED = ("kvcore", "paged_kv_lab", "bench", "scripts", "tests")

# each list, and the one module that may spell it out
LISTS = {
    "HASH_ALGOS": (HASH_ALGOS, "kvcore/utils/hashing.py"),
    "FREE_ORDERS": (FREE_ORDERS, "kvcore/core/block_pool.py"),
    "POLICIES": (POLICIES, "kvcore/core/sched/request_queue.py"),
    "ADMISSIONS": (ADMISSIONS, "kvcore/config/scheduler.py"),
    "MAMBA_CACHE_MODES": (MAMBA_CACHE_MODES, "kvcore/kv_cache_interface.py"),
    "MODEL_CHOICES": (MODEL_CHOICES, "kvcore/model/shapes.py"),
    "ATTENTION_MODELS": (ATTENTION_MODELS, "kvcore/model/shapes.py"),
    "TINY_MODELS": (TINY_MODELS, "kvcore/model/shapes.py"),
    "DEVICE_CHOICES": (DEVICE_CHOICES, "kvcore/model/shapes.py"),
    "DTYPE_CHOICES": (DTYPE_CHOICES, "kvcore/model/shapes.py"),
    "ROUTERS": (ROUTERS, "paged_kv_lab/fleet/router.py"),
}


def _strings(nodes) -> frozenset | None:
    """The values of a literal made only of string constants (at least two), else None."""
    values = [n.value for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    return frozenset(values) if len(values) == len(nodes) >= 2 else None


def literal_copies(tree: ast.AST):
    """(line, values) of every tuple, list or set literal of strings in ``tree`` (a dict keyed by
    the choices maps each to something of its own: not a copy)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            found = _strings(node.elts)
            if found is not None:
                yield node.lineno, found


def test_every_list_is_defined_once():
    by_values = {}
    for name, (values, home) in LISTS.items():
        assert len(set(values)) == len(values), f"{name} repeats a value"
        by_values.setdefault(frozenset(values), []).append((name, home))
    copies = []
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if "/.venv/" in f"/{rel}" or rel.startswith("tests/fixtures/"):
                continue
            for line, found in literal_copies(ast.parse(path.read_text(encoding="utf-8"))):
                for name, home in by_values.get(found, ()):
                    if rel != home:
                        copies.append(f"{rel}:{line}: a copy of {name} (defined in {home})")
    assert not copies, "\n".join(copies)


def test_the_check_finds_a_copy():
    copy = ast.parse('POLICIES = ["priority", "fcfs"]\nf(("v0.33", "legacy"))\nx = ("a", 1)')
    assert [found for _, found in literal_copies(copy)] == [
        frozenset(POLICIES),
        frozenset(FREE_ORDERS),
    ]


def test_kvcore_accepts_exactly_its_lists():
    """The lists are the values kvcore's code takes (and the lab's schema is built on them)."""
    from paged_kv_lab.run import scenario

    assert set(HASH_ALGOS) == set(HASH_FUNCTIONS) and HASH_ALGOS[0] == "xxhash"
    assert scenario.HASH_ALGOS is HASH_ALGOS and scenario.POLICIES is POLICIES
    assert scenario.FREE_ORDERS is FREE_ORDERS and scenario.ADMISSIONS is ADMISSIONS
    assert scenario.MODELS is MODEL_CHOICES and scenario.DEVICES is DEVICE_CHOICES
    assert scenario.DTYPES is DTYPE_CHOICES and scenario.MAMBA_CACHE_MODES is MAMBA_CACHE_MODES
    assert set(ATTENTION_MODELS) | {"tiny-hybrid"} == set(MODEL_CHOICES)
    assert set(TINY_MODELS) == set(MODEL_CHOICES) - {"smollm2"}


def test_the_forms_and_command_lines_offer_the_lists(capsys):
    """The playground's selects, the sidebar and the command lines' choices are the lists."""
    from paged_kv_lab.cli.main import main
    from paged_kv_lab.ui import modelstate, playground

    assert playground.CHOICES == {
        "hash_algo": HASH_ALGOS,
        "policy": POLICIES,
        "free_order": FREE_ORDERS,
        "admission": ADMISSIONS,
    }
    assert modelstate.MODELS == ATTENTION_MODELS and modelstate.DEVICES == DEVICE_CHOICES
    for argv, values in (
        (["run", "--help"], MODEL_CHOICES),
        (["run", "--help"], DEVICE_CHOICES),
        (["profile", "--help"], DTYPE_CHOICES),
        (["model", "save", "--help"], TINY_MODELS),
        (["fleet", "--help"], ROUTERS),
    ):
        with pytest.raises(SystemExit):
            main(argv)
        shown = capsys.readouterr().out
        assert "{" + ",".join(values) + "}" in shown, (argv, values)


def _doc_row(page: str, field: str) -> str:
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    row = next(ln for ln in text.splitlines() if ln.startswith(f"| `{field}` |"))
    return row


@pytest.mark.parametrize(
    "field, values",
    [
        ("model", MODEL_CHOICES),
        ("device", DEVICE_CHOICES),
        ("dtype", DTYPE_CHOICES),
        ("engine.hash_algo", HASH_ALGOS),
        ("engine.policy", POLICIES),
        ("engine.free_order", FREE_ORDERS),
        ("engine.admission", ADMISSIONS),
    ],
)
def test_the_scenario_page_names_every_choice(field, values):
    named = set(re.findall(r"`([^`]+)`", _doc_row("scenario.md", field)))
    assert set(values) <= named, f"docs/scenario.md's {field} row misses {set(values) - named}"


def test_the_fleet_page_lists_the_routers_in_order():
    text = (ROOT / "docs" / "fleet.md").read_text(encoding="utf-8")
    table = text.split("| `--router` |", 1)[1].split("\n\n", 1)[0]
    listed = tuple(re.findall(r"^\| `([a-z_]+)` \|", table, re.MULTILINE))
    assert listed == ROUTERS
