"""The installable package: what the wheel carries and the import names it installs, its metadata
(license, pins, console scripts), the declared dependencies against the imports, the constraints
file against the pins, the app's Streamlit config wherever the app starts, the ``paged-kv-lab``
launcher, the player's fallback when Streamlit's private component manager moves, and the replay's
progress bar and default trace. The last test installs the wheel into a fresh venv outside the
repository and runs the CLI's replay and the app's server from there (~15 s, the tiny model's
settings; no SmolLM2)."""

from __future__ import annotations

import ast
import contextlib
import importlib.metadata as md
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import types
import urllib.request
import zipfile
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.version import Version

from paged_kv_lab.cli.main import main as cli_main
from support.paths import ROOT

PACKAGES = ("kvcore", "paged_kv_lab")
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
SHIPPED_TRACE = "paged_kv_lab/workloads/traces/mooncake_synthetic_trace.jsonl"
# Declared but never imported by our code: what transformers itself needs on our path.
NOT_IMPORTED = {
    "gguf": "transformers reads SmolLM2's GGUF file with it",
    "accelerate": "transformers refuses to load a GGUF file without it",
}
# Imported only behind an optional extra (declared there, not installed by default).
OPTIONAL_IMPORTS = {"ray": "the `ray` extra: sweeps as Ray tasks (workloads/sweep.py)"}
# Where a dependency's upper bound is required: private or byte-exact use.
BOUNDED = ("torch", "streamlit", "cbor2", "xxhash", "transformers")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(*extras: str) -> list[Requirement]:
    project = PYPROJECT["project"]
    lines = list(project["dependencies"])
    for extra in extras:
        lines += project["optional-dependencies"][extra]
    return [Requirement(line) for line in lines]


def build_wheel(workdir: Path) -> Path:
    """The wheel ``pip wheel .`` makes, built from a copy of the checkout (a build writes build/
    and *.egg-info beside its sources, which must not land in a shared checkout)."""
    src = workdir / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE", "NOTICE"):
        shutil.copy2(ROOT / name, src / name)
    for pkg in PACKAGES:
        shutil.copytree(
            ROOT / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )
    dist = workdir / "dist"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index"]
        + ["-q", "-w", str(dist), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = dist.glob("paged_kv_lab-*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def wheel_names(wheel) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        return set(z.namelist())


def dist_info(wheel: Path, name: str) -> str:
    with zipfile.ZipFile(wheel) as z:
        (path,) = [n for n in z.namelist() if re.fullmatch(rf"[^/]+\.dist-info/{name}", n)]
        return z.read(path).decode("utf-8")


# --------------------------------------------------------------------------- the wheel


def test_the_wheel_installs_only_kvcore_and_paged_kv_lab(wheel, wheel_names):
    tops = {n.split("/")[0] for n in wheel_names if ".dist-info/" not in n}
    assert tops == set(PACKAGES)
    assert set(dist_info(wheel, "top_level.txt").split()) == set(PACKAGES)


def test_the_wheel_carries_the_data_files(wheel_names):
    must = [
        SHIPPED_TRACE,
        "paged_kv_lab/workloads/traces/README.md",  # the trace's attribution
        "paged_kv_lab/.streamlit/config.toml",
        "paged_kv_lab/streamlit_app.py",
        "paged_kv_lab/text/languages.json",
    ]
    for pattern in (
        "paged_kv_lab/player/assets/*",
        "paged_kv_lab/text/*.json",
        "paged_kv_lab/text/catalogue/**/*.json",
        "paged_kv_lab/content/**/*.yaml",
        "paged_kv_lab/content/**/*.json",
    ):
        must += [p.relative_to(ROOT).as_posix() for p in ROOT.glob(pattern) if p.is_file()]
    assert any(m.startswith("paged_kv_lab/text/catalogue/") for m in must)
    assert any(m.startswith("paged_kv_lab/content/lessons/") for m in must)
    assert sorted(set(must) - wheel_names) == []


def test_the_wheel_carries_every_file_of_the_checkouts_packages(wheel_names):
    """A new data folder (or file kind) under the packages needs its package-data glob."""
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout: the package's file list is unknown")
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", *PACKAGES],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    present = [f for f in listed if (ROOT / f).is_file()]  # a deletion not yet committed
    assert present and sorted(set(present) - wheel_names) == []


def test_the_wheel_metadata_license_scripts_and_pins(wheel, wheel_names):
    meta = dist_info(wheel, "METADATA")
    assert "License-Expression: Apache-2.0" in meta
    licenses = {n.split(".dist-info/licenses/")[1] for n in wheel_names if "/licenses/" in n}
    assert {"LICENSE", "NOTICE", "paged_kv_lab/workloads/traces/README.md"} <= licenses
    assert "Apache License" in (ROOT / "LICENSE").read_text(encoding="utf-8")[:200]
    scripts = dist_info(wheel, "entry_points.txt")
    assert re.search(r"^paged-kv-lab = paged_kv_lab\.cli\.launch:main$", scripts, re.M)
    assert re.search(r"^paged-kv-lab-cli = paged_kv_lab\.cli\.main:main$", scripts, re.M)
    required = [Requirement(r) for r in re.findall(r"^Requires-Dist: (.*)$", meta, re.M)]
    reqs = {canonical(r.name): r for r in required if r.marker is None}
    for name in BOUNDED:
        assert any(s.operator in ("<", "<=", "==", "~=") for s in reqs[name].specifier), name
    assert not reqs["transformers"].specifier.contains("4.57.0")
    assert reqs["transformers"].specifier.contains("5.0.0")


# --------------------------------------------------------------------------- dependencies


def third_party_imports() -> dict[str, set[str]]:
    """{top-level module: files importing it} over the packages, stdlib and our own left out."""
    found: dict[str, set[str]] = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in PACKAGES:
                        found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_import_is_declared_and_every_dependency_used():
    declared = {canonical(r.name) for r in requirements()}
    owners = md.packages_distributions()
    imported = set()
    for module, files in sorted(third_party_imports().items()):
        if module in OPTIONAL_IMPORTS:
            assert module in PYPROJECT["project"]["optional-dependencies"], module
            continue
        dists = {canonical(d) for d in owners.get(module, [])}
        assert dists, f"{module} (imported by {sorted(files)[:3]}) is not installed"
        assert dists & declared, f"{module} is imported ({sorted(files)[:3]}) but not declared"
        imported |= dists & declared
    unused = declared - imported - set(NOT_IMPORTED)
    assert unused == set(), f"declared but never imported: {sorted(unused)}"
    assert set(NOT_IMPORTED) <= declared


def test_constraints_pin_every_dependency_inside_its_bounds():
    pins = {}
    for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[canonical(name)] = Version(version)
    for req in requirements("test", "docs"):
        name = canonical(req.name)
        if name == "torch":  # scripts/setup.sh installs it, keeping a build the user chose
            assert name not in pins
            continue
        if name == "paged-kv-lab":  # the test extra pulls in the project's own docs extra
            continue
        assert name in pins, f"{name} has no version in constraints.txt"
        assert req.specifier.contains(pins[name], prereleases=True), (name, str(pins[name]))
    setup = (ROOT / "scripts" / "setup.sh").read_text(encoding="utf-8")
    assert "-c constraints.txt" in setup
    assert re.search(r"^hash_now=.*constraints\.txt", setup, re.M)  # a new pin reinstalls


# --------------------------------------------------------------------------- the app's start


def test_streamlit_reads_the_apps_config_from_any_working_directory(tmp_path):
    """Streamlit takes a .streamlit/config.toml beside the main script as that script's own; what
    `streamlit run` sets (web/cli.py) is set here, in a process of its own."""
    script = ROOT / "paged_kv_lab" / "streamlit_app.py"
    code = (
        "from streamlit import config\n"
        f"config._main_script_path = {str(script)!r}\n"
        "config.get_config_options(force_reparse=True)\n"
        "print(config.get_option('server.maxUploadSize'), config.get_option('runner.postScriptGC'),"
        " config.get_option('browser.gatherUsageStats'))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMLIT_")}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["32", "False", "False"]


def test_paged_kv_lab_runs_streamlit_on_the_packages_own_script(monkeypatch):
    from paged_kv_lab.cli import launch

    class Replaced(Exception):  # execv does not return
        pass

    def execv(exe, argv):
        raise Replaced(exe, argv)

    monkeypatch.setattr(launch.os, "name", "posix")
    monkeypatch.setattr(launch.os, "execv", execv)
    with pytest.raises(Replaced) as ran:
        launch.main(["--server.port", "8765"])
    exe, argv = ran.value.args
    script = ROOT / "paged_kv_lab" / "streamlit_app.py"
    assert exe == sys.executable
    assert argv == [sys.executable, "-m", "streamlit", "run", str(script), "--server.port", "8765"]
    assert (script.parent / ".streamlit").is_dir() and not (script.parent / "pages").exists()


@pytest.mark.parametrize("how", ["module moved", "signature changed"])
def test_the_player_goes_inline_when_streamlits_component_manager_moves(monkeypatch, how):
    import streamlit as st
    from streamlit.runtime import Runtime

    from paged_kv_lab.player.export import asset, module_js
    from paged_kv_lab.ui import player_component as pc

    manager_module = "streamlit.components.v2.get_bidi_component_manager"
    if how == "module moved":
        monkeypatch.setitem(sys.modules, manager_module, None)  # importing it raises ImportError
    else:

        class Reshaped:
            def register_from_manifest(self, manifest):  # one argument fewer than ours
                raise AssertionError("not reached")

        fake = types.ModuleType(manager_module)
        fake.get_bidi_component_manager = Reshaped
        monkeypatch.setitem(sys.modules, manager_module, fake)
    monkeypatch.setattr(Runtime, "exists", staticmethod(lambda: True))
    made = []
    monkeypatch.setattr(st.components.v2, "component", lambda name, **kw: made.append(kw) or kw)
    pc.player_component()
    assert made == [{"html": asset("player.html"), "css": asset("player.css"), "js": module_js()}]


# --------------------------------------------------------------------------- the replay


SMALL = ["--set", "block_size=512", "--set", "num_gpu_blocks=140"]


def test_replay_defaults_to_the_shipped_trace_and_draws_a_tqdm_bar(capsys):
    assert cli_main(["replay", "--requests", "40", *SMALL, "--json", "-", "--progress"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["requests"] == 40
    # tqdm's bar (label, unit and rate), redrawn in place, then the table (on stderr with --json -)
    assert "replay" in err and "/40 [" in err and "requests/s" in err and "\r" in err
    assert "hit rate" in err.rsplit("\r", 1)[-1]
    assert cli_main(["replay", "--requests", "40", *SMALL, "--json", "-"]) == 0
    assert "/40 [" not in capsys.readouterr().err  # not a terminal, no --progress: no bar


# --------------------------------------------------------------------------- installed


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(cmd: list[str], cwd: Path, env: dict, timeout: float = 120):
    """Start ``cmd`` (its own process group, its log in a file) and wait for /_stcore/health."""
    port = free_port()
    log = (cwd / "server.log").open("wb")
    proc = subprocess.Popen(
        cmd + ["--server.address", "127.0.0.1", "--server.port", str(port)],
        cwd=cwd,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(url + "/_stcore/health", timeout=2) as r:
                    if r.read().decode().strip() == "ok":
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail("the app did not answer: " + (cwd / "server.log").read_text()[-2000:])
            time.sleep(0.3)
        yield url, proc
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


class Installed:
    """The wheel, installed (not editable) into a new venv outside the repository whose other
    packages come from this environment's site-packages (a .pth line, added after the install so
    that pip sees an empty venv). Commands run in a folder of their own, on the tiny model."""

    def __init__(self, wheel: Path, base: Path) -> None:
        self.cwd = base / "elsewhere"
        self.cwd.mkdir()
        self.env = {
            **{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")},
            "PAGED_KV_LAB_MODEL": "tiny-random",
            "PAGED_KV_LAB_DEVICE": "cpu",
            # no background warm-up: a script that ends while it steps the model is aborted
            "PAGED_KV_LAB_WARM_UP": "0",
        }
        self.venv = base / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(self.venv)], check=True)
        self.python = self.venv / "bin" / "python"
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "--python", str(self.python), "install", "-q"]
            + ["--no-deps", "--no-index", str(wheel)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        site = self.run("-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
        pth = Path(site.stdout.strip()) / "_project_env.pth"
        pth.write_text(sysconfig.get_paths()["purelib"] + "\n")

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        """``python ARGS`` in the venv; it must succeed."""
        out = subprocess.run(
            [str(self.python), *map(str, args)],
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        return out


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Installed:
    return Installed(wheel, tmp_path_factory.mktemp("installed"))


def test_the_wheel_installed_in_a_fresh_venv_replays_and_serves(installed):
    """From the installed wheel: the package's data read from where it was installed, `python -m
    kvcore replay` on the shipped trace, and `paged-kv-lab` serving the app."""
    venv, run = installed.venv, installed.run
    check = run(
        "-c",
        "import json, kvcore, paged_kv_lab\n"
        "from paged_kv_lab.player.export import module_js\n"
        "from paged_kv_lab.text.i18n import catalogue, languages\n"
        "from paged_kv_lab.workloads import SHIPPED_TRACE\n"
        "print(json.dumps({'files': [kvcore.__file__, paged_kv_lab.__file__, str(SHIPPED_TRACE)],"
        " 'trace': SHIPPED_TRACE.is_file(), 'js': len(module_js()),"
        " 'keys': len(catalogue()), 'languages': sorted(languages())}))",
    )
    got = json.loads(check.stdout)
    assert all(Path(f).is_relative_to(venv) for f in got["files"]), got["files"]
    assert got["trace"] and got["js"] > 1000 and got["keys"] > 100
    assert {"en", "zh"} <= set(got["languages"])

    replayed = run("-m", "paged_kv_lab", "replay", "--requests", "40", *SMALL, "--json", "-")
    assert json.loads(replayed.stdout)["requests"] == 40
    assert "hit rate" in replayed.stderr

    launcher = venv / "bin" / "paged-kv-lab"
    assert str(venv) in launcher.read_text().splitlines()[0]  # the venv's own interpreter
    app = [str(launcher), "--server.headless", "true"]
    with serving(app, installed.cwd, installed.env) as (url, _):
        with urllib.request.urlopen(url + "/", timeout=10) as r:
            assert r.status == 200
    log = (installed.cwd / "server.log").read_text()
    assert "Traceback" not in log, log[-2000:]


@pytest.mark.slow  # ~40 s on 2 busy cores: the home page records its run on the tiny model
def test_the_installed_app_shows_its_pages(installed):
    """The installed app run by Streamlit's AppTest: the home page and a lesson page render with
    no exception, from the files the wheel carries (page registry, catalogue, lesson folders)."""
    out = installed.run(
        "-c",
        "import json, paged_kv_lab\n"
        "from pathlib import Path\n"
        "from streamlit.testing.v1 import AppTest\n"
        "app = Path(paged_kv_lab.__file__).parent / 'streamlit_app.py'\n"
        "at = AppTest.from_file(str(app), default_timeout=240).run()\n"
        "home = [e.value for e in at.exception], len(at.markdown)\n"
        "from streamlit.util import calc_hash\n"
        "from paged_kv_lab.content.registry import page\n"
        "at._page_hash = calc_hash(page('blocks').url_path)  # as tests/_app_helpers.open_page\n"
        "at.run()\n"
        "lesson = [e.value for e in at.exception], len(at.markdown)\n"
        "print(json.dumps({'app': str(app), 'home': home, 'lesson': lesson}))",
        timeout=600,
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert Path(got["app"]).is_relative_to(installed.venv)
    for page in ("home", "lesson"):
        errors, shown = got[page]
        assert errors == [] and shown > 0, (page, errors)
