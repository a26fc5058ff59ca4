"""The house's rules, read from the code itself (no module is imported): imports run one way.

- kvcore (the vLLM mirror) imports nothing of the lab around it; only its model and worker
  parts import torch/transformers, and no part of it imports streamlit or plotly;
- each folder beside kvcore imports only the layers below it (the table ``MAY_IMPORT``), and
  every one of them may import the catalogue lookup ``paged_kv_lab.text.i18n`` (``LEAF``: it
  imports nothing of the lab, so a refusal in record/ or workload/ can carry a ``Text``);
- the run store and the player import no Streamlit, the player no lesson code;
- benchmarks import no test helpers.
"""

import ast
from pathlib import Path

import pytest

from support.paths import ROOT

LAB = "paged_kv_lab"
# The lab's subpackages (paged_kv_lab/<name>), and kvcore beside the lab, lowest layer first.
OURS = (
    "kvcore",
    "text",
    "recording",
    "run",
    "disagg",
    "why",
    "player",
    "store",
    "watch",
    "workloads",
    "designs",
    "fleet",
    "classroom",
    "content",
    "ui",
    "cli",
)
# Which of our packages each one may import (besides itself). A package's job (docs/layout.md):
# text = the catalogue lookup; recording = the typed record of what the engine decided;
# run = the scenario, its budget, the engine driven step by step and the trace file; disagg = a
# prefill/decode pair of engines; why = narration and the why-answers; player = the browser
# player and its encoder; store = what the server computes once and shares (recorded runs, their
# timelines, token text, the shared cache); watch = a real vLLM's KV events; workloads = trace
# formats, replay, sweeps, the bound; designs = SGLang's and nano-vllm's caches; fleet = replicas
# behind a router; classroom = rooms and the class pack's pages; content = lessons, cases, topics
# and the page registry; ui = the Streamlit pages; cli = the command line.
MAY_IMPORT = {
    "kvcore": set(),
    "text": {"kvcore"},
    "recording": {"kvcore"},
    "run": {"kvcore", "recording"},
    "disagg": {"kvcore", "recording", "run"},
    # a P/D run's "why?" reads both pools as the lesson draws them (disagg/pd.py: pair_at)
    "why": {"kvcore", "recording", "run", "disagg"},
    "player": {"kvcore", "recording", "run", "why"},
    # a run's steps come from an Engine or a P/D pair (disagg/pd.py: engine_for)
    "store": {"kvcore", "recording", "run", "disagg"},
    "watch": {"kvcore"},
    "workloads": {"kvcore", "recording", "run", "why", "store"},
    "designs": {"kvcore", "recording", "run", "workloads"},
    "fleet": {"kvcore", "recording", "run", "watch", "workloads"},
    "classroom": {"kvcore", "recording", "run", "player"},
    "content": {"kvcore", "recording", "run", "why"},
    "ui": set(OURS) - {"ui", "cli"},
    # the class pack's command builds the pack with the app's own code (ui/class_pack.py: the
    # pages' order, each lesson's narration and panels, the store's runs), not with a copy of it
    "cli": set(OURS) - {"cli"},
}
# The catalogue lookup (Text, tr): a leaf every lab folder may import, kvcore not. It imports
# nothing of the lab itself (tested below), so importing it never pulls a higher layer in.
LEAF = "paged_kv_lab.text.i18n"
ML = {"torch", "transformers", "gguf", "accelerate"}
UI_LIBS = {"streamlit", "plotly", "pandas"}
# Besides model/ and worker/: the CPU tier's and the NIXL connector's worker halves copy the KV
# tensors themselves (vLLM: v1/simple_kv_offload/worker.py, kv_connector/v1/nixl/pull_worker.py);
# their scheduler halves stay torch-free. LoRA's worker side holds and multiplies adapter weights
# (vLLM: lora/); its request and peft_helper (what the scheduler and the checks read) stay free.
ML_FILES = {
    "kvcore/simple_kv_offload/worker.py",
    "kvcore/distributed/kv_transfer/kv_connector/v1/nixl/pull_worker.py",
    "kvcore/lora/lora_weights.py",
    "kvcore/lora/lora_model.py",
    "kvcore/lora/model_manager.py",
    "kvcore/lora/worker_manager.py",
    "kvcore/lora/layers/base_linear.py",
    "kvcore/lora/punica_wrapper/punica_base.py",
}


def imports_of(path: Path) -> set[str]:
    """Top-level names of every absolute import in the file (function-level ones included; those
    under ``if TYPE_CHECKING:`` load nothing at run time and are left out)."""
    return {_top(m) for m in modules_of(path)}


def modules_of(path: Path) -> set[str]:
    """Every module (or ``module.name`` of a from-import) the file imports at run time."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    type_only = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING")
        for stmt in node.body
        for n in ast.walk(stmt)
    }
    out = set()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import (the house uses absolute ones)"
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


def layered_imports_of(path: Path, pkg: str) -> set[str]:
    """The packages ``path`` (in ``pkg``) imports that the layering judges: the leaf ``LEAF`` is
    left out for every lab folder, never for kvcore."""
    return {
        _top(m)
        for m in modules_of(path)
        if pkg == "kvcore" or not (m == LEAF or m.startswith(LEAF + "."))
    }


def _top(module: str) -> str:
    """The package an import names: kvcore, a lab subpackage (``paged_kv_lab.<name>``), or any
    other top-level name."""
    parts = module.split(".")
    return parts[1] if parts[0] == LAB and len(parts) > 1 else parts[0]


def files(pkg: str) -> list[Path]:
    base = ROOT / pkg if pkg in ("kvcore", "bench") else ROOT / LAB / pkg
    return sorted(base.rglob("*.py"))


@pytest.mark.parametrize("pkg", OURS)
def test_imports_run_one_way(pkg):
    bad = []
    for f in files(pkg):
        rel = f.relative_to(ROOT).as_posix()
        for name in layered_imports_of(f, pkg) & set(OURS) - {pkg} - MAY_IMPORT[pkg]:
            bad.append(f"{rel} imports {name}")
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


def test_only_kvcores_model_and_worker_import_torch_and_none_imports_ui_libraries():
    bad = []
    for f in files("kvcore"):
        rel = f.relative_to(ROOT).as_posix()
        found = imports_of(f)
        if found & UI_LIBS:
            bad.append(f"{rel} imports {sorted(found & UI_LIBS)}")
        if (
            found & ML
            and not rel.startswith(("kvcore/model/", "kvcore/worker/"))
            and rel not in ML_FILES
        ):
            bad.append(f"{rel} imports {sorted(found & ML)}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("pkg", [p for p in OURS if p != "ui"])
def test_only_the_ui_imports_streamlit(pkg):
    bad = [f"{f.relative_to(ROOT)}" for f in files(pkg) if imports_of(f) & {"streamlit", "plotly"}]
    assert not bad, bad


def test_benchmarks_import_no_test_helpers():
    helpers = {p.stem for p in (ROOT / "tests").rglob("test_*.py")}
    helpers |= {"tests", "conftest", "support"}
    bad = [
        f"{f.name} imports {sorted(imports_of(f) & helpers)}"
        for f in files("bench")
        if imports_of(f) & helpers
    ]
    assert not bad, bad


def test_the_rules_would_catch_a_wrong_import(tmp_path):
    """The checker itself: a kvcore-like file importing the recorder is reported."""
    f = tmp_path / "x.py"
    f.write_text(
        "import os\nfrom paged_kv_lab.recording.recorder import Recorder\n\n"
        "def f():\n    import streamlit\n"
    )
    assert imports_of(f) == {"os", "recording", "streamlit"}


def test_the_catalogue_lookup_is_a_leaf():
    """``LEAF`` imports nothing of the lab (nor kvcore), so every layer may import it."""
    leaf = ROOT / (LEAF.replace(".", "/") + ".py")
    assert leaf.is_file()
    ours = [m for m in modules_of(leaf) if m.split(".")[0] in (LAB, "kvcore")]
    assert not ours, f"{LEAF} imports {ours}"


def test_the_leaf_is_allowed_to_the_lab_but_not_to_kvcore(tmp_path):
    """The checker: record/ may import ``Text`` from the leaf, not the rest of text/; kvcore may
    import neither."""
    f = tmp_path / "x.py"
    f.write_text(
        "from paged_kv_lab.text.i18n import Text\nfrom paged_kv_lab.text import i18n\n"
        "from paged_kv_lab.why.sentences import sentence\n"
    )
    assert layered_imports_of(f, "recording") == {"why"}  # sentences.py, not the leaf
    f.write_text("from paged_kv_lab.text.i18n import Text\nfrom paged_kv_lab.text import i18n\n")
    assert layered_imports_of(f, "recording") == set()
    assert layered_imports_of(f, "kvcore") == {"text"}


def lab_packages() -> set[str]:
    return {p.name for p in (ROOT / LAB).iterdir() if p.is_dir() and any(p.rglob("*.py"))}


def test_every_lab_package_has_its_place_in_the_layering():
    """A new folder of the lab says what it may import (``MAY_IMPORT``) before it lands."""
    assert lab_packages() <= set(OURS), sorted(lab_packages() - set(OURS))


def test_kvcore_imports_nothing_of_the_lab_and_has_no_command_line():
    """No door from kvcore up: the command line is ``python -m paged_kv_lab``."""
    assert not (ROOT / "kvcore" / "__main__.py").exists()
    bad = [
        f"{f.relative_to(ROOT)}: {m}"
        for f in files("kvcore")
        for m in modules_of(f)
        if m.split(".")[0] == LAB
    ]
    assert not bad, bad


def test_no_two_modules_of_the_lab_share_a_name():
    """A module's name says its job, once: ``trace.py`` twice (each with its own error) is how a
    reader opens the wrong file."""
    seen: dict[str, list[str]] = {}
    for f in (ROOT / LAB).rglob("*.py"):
        if f.name != "__init__.py":
            seen.setdefault(f.stem, []).append(f.relative_to(ROOT).as_posix())
    twice = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not twice, twice


def package_graph() -> dict[str, set[str]]:
    """Which of the lab's packages (and kvcore) each one imports, read from the code."""
    graph: dict[str, set[str]] = {}
    for pkg in OURS:
        graph[pkg] = set()
        for f in files(pkg):
            graph[pkg] |= (imports_of(f) & set(OURS)) - {pkg}
    return graph


def cycles_in(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every package that can reach itself, with one such path."""
    out = []
    for start in sorted(graph):
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in sorted(graph.get(node, ())):
                if nxt == start:
                    out.append(path + [start])
                    stack = []
                    break
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))
    return out


def test_no_import_cycle_between_the_labs_packages():
    assert not cycles_in(package_graph()), cycles_in(package_graph())


def test_the_cycle_check_finds_a_planted_cycle():
    assert cycles_in({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})[0] == ["a", "b", "c", "a"]
    assert not cycles_in({"a": {"b"}, "b": set()})
