"""vLLM 0.34.0's own tests/v1/core run against kvcore: the yardstick (issues 36 and 44).

Takes vLLM's unit tests from its source distribution, unchanged, into a scratch directory, and runs
them three times under the Python of the vLLM scratch environment (``bash scripts/vllm_env.sh``):

1. the baseline, vLLM alone: which tests run on this machine at all (CPU only, offline);
2. with kvcore swapped in (scripts/vllm_core_tests/conftest.py, the adapter: kvcore's BlockPool,
   BlockHashToBlockMap, FreeKVCacheBlockQueue and KVCacheBlock stand in for vLLM's everywhere, so
   vLLM's managers and Scheduler run on kvcore's block layer);
3. test_scheduler.py with kvcore's own Scheduler, KVCacheManager and pool built from the tests'
   VllmConfig (scripts/vllm_core_tests/kvcore_scheduler.py, the adapter's second mode; its own
   table, where "passed" means kvcore's Scheduler ran in the test; ``--no-scheduler`` skips it).

The baseline's outcomes depend only on vLLM and this machine, so they are cached beside the sdist,
keyed by what they depend on (``baseline_key``); ``--fresh-baseline`` runs vLLM alone again.
Each test that passed in the baseline then lands in one row of the table:

- passed, kvcore's code ran in it;
- passed, no kvcore code ran (vLLM's own code passing its own test: not counted);
- not modelled: it failed on a feature kvcore does not model, named either by the adapter
  (``Unmodelled``) or by the reviewed mapping in scripts/vllm_core_tests/unmodelled.yaml (a
  method or attribute of kvcore's classes that vLLM's code calls and kvcore does not have, each
  mapped to its feature by hand after reading vLLM's code);
- behaviour differs: every other failure (each one is a bug to fix or a mapping entry to review
  and add; the block layer's are zero, the exit status says whether they still are; the second
  mode's open ones are listed in docs/fidelity.md).

    .venv/bin/python scripts/vllm_core_tests.py                # the three files of issue 36
    .venv/bin/python scripts/vllm_core_tests.py --json out.json --files test_prefix_caching.py

The sdist (vllm-0.34.0.tar.gz, sha256-checked against PyPI's index) and pytest for the vLLM
environment are cached under VLLM_SDIST_CACHE (default /tmp/vllm-sdist-cache); each version's
scratch directory is its own there (run-0.34.0). Without the vLLM 0.34.0 environment (VLLM_VENV,
default /tmp/vllm034-venv, the one scripts/vllm_env.sh builds) it says how to make one and
exits 0.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import urllib.request
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent / "vllm_core_tests"
VERSION = "0.34.0"
SDIST = f"vllm-{VERSION}.tar.gz"
FILES = ("test_kv_cache_utils.py", "test_prefix_caching.py", "test_scheduler.py")
# the files whose tests build a scheduler with tests/v1/core/utils.py's create_scheduler: the
# second mode runs them with kvcore's own Scheduler (scripts/vllm_core_tests/kvcore_scheduler.py)
SCHEDULER_FILES = ("test_scheduler.py",)
CATEGORIES = ("passed_kvcore", "passed_vllm_only", "not_modelled", "behaviour_differs")


def fetch_sdist(cache: Path, venv_python: str) -> Path:
    """The sdist, from the cache or PyPI. ``pip download --no-binary :all:`` would build the
    package's metadata (cmake, CUDA), so the file is taken from PyPI's simple index (PEP 691) as
    pip would, and its sha256 checked against the index's."""
    path = cache / SDIST
    if path.exists():
        return path
    cache.mkdir(parents=True, exist_ok=True)
    req = urllib.request.Request(
        "https://pypi.org/simple/vllm/",
        headers={"Accept": "application/vnd.pypi.simple.v1+json"},
    )
    with urllib.request.urlopen(req, timeout=60) as fh:
        index = json.load(fh)
    (entry,) = [f for f in index["files"] if f["filename"] == SDIST]
    tmp = path.with_suffix(".part")
    with urllib.request.urlopen(entry["url"], timeout=600) as fh, open(tmp, "wb") as out:
        shutil.copyfileobj(fh, out)
    digest = hashlib.sha256(tmp.read_bytes()).hexdigest()
    if digest != entry["hashes"]["sha256"]:
        tmp.unlink()
        raise RuntimeError(f"{SDIST}: sha256 {digest} is not PyPI's {entry['hashes']['sha256']}")
    tmp.rename(path)
    return path


def ensure_pytest(cache: Path, venv_python: str) -> Path:
    """pytest for the vLLM environment, in a folder of its own (the environment stays as
    scripts/vllm_env.sh built it)."""
    target = cache / "pytest"
    if not (target / "pytest").exists():
        subprocess.run(
            [venv_python, "-m", "pip", "install", "-q", "--target", str(target), "pytest"],
            check=True,
        )
    return target


def prepare(sdist: Path, scratch: Path, venv_python: str) -> None:
    """vLLM's tests/, unchanged, under a root conftest that is the adapter. The sdist's own
    tests/conftest.py is left out: it sets up model downloads and GPUs, none of which these
    tests use. vLLM runs as its CPU platform (VLLM_TARGET_DEVICE=cpu), offline, with stand-in
    configs for the models the tests name (standin_models.py)."""
    if scratch.exists():
        shutil.rmtree(scratch)
    scratch.mkdir(parents=True)
    prefix = f"vllm-{VERSION}/tests/"
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        for m in members:
            m.name = m.name[len(f"vllm-{VERSION}/") :]
        tar.extractall(scratch, members=members, filter="data")
    (scratch / "tests" / "conftest.py").unlink()
    shutil.copy(HERE / "conftest.py", scratch / "conftest.py")
    subprocess.run([venv_python, str(HERE / "standin_models.py"), str(scratch / "hf")], check=True)


def run_pytest(
    venv_python, scratch, pytest_dir, files, swap: bool, timeout: int, scheduler: bool = False
) -> dict:
    """One pytest run; returns {nodeid: outcome} and the adapter's per-test notes. ``swap``:
    kvcore's block layer in; ``scheduler``: kvcore's own Scheduler too (the second mode)."""
    tag = "scheduler" if scheduler else "kvcore" if swap else "baseline"
    xml, touched = scratch / f"{tag}.xml", scratch / f"{tag}.json"
    env = dict(
        os.environ,
        KVCORE_REPO=str(REPO),
        YARDSTICK_SWAP="1" if swap else "0",
        YARDSTICK_SCHEDULER="1" if scheduler else "0",
        YARDSTICK_TOUCHED=str(touched),
        HF_HOME=str(scratch / "hf"),
        HF_HUB_OFFLINE="1",
        VLLM_TARGET_DEVICE="cpu",
        TRANSFORMERS_OFFLINE="1",
        PYTHONPATH=str(pytest_dir),
        PYTHONHASHSEED="0",
    )
    # --tb=line: the outcome is all the table reads (the adapter records each failure's kind
    # itself); pytest's long tracebacks for some 200 failures took 80 s of a 100 s run
    cmd = [venv_python, "-m", "pytest", "-q", "--tb=line", "-p", "no:cacheprovider"]
    cmd += [f"--junitxml={xml}"]
    cmd += [f"tests/v1/core/{f}" for f in files]
    subprocess.run(
        cmd, cwd=scratch, env=env, timeout=timeout, check=False, stdout=subprocess.DEVNULL
    )
    return read_results(scratch, tag)


def read_results(scratch: Path, tag: str) -> dict:
    xml, touched = scratch / f"{tag}.xml", scratch / f"{tag}.json"
    outcomes = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        path = case.get("classname", "").replace(".", "/")
        nodeid = f"{path}.py::{case.get('name')}"
        if case.find("skipped") is not None:
            outcomes[nodeid] = "skipped"
        elif case.find("failure") is not None or case.find("error") is not None:
            outcomes[nodeid] = "failed"
        else:
            outcomes[nodeid] = "passed"
    notes = json.loads(touched.read_text()) if touched.exists() else {"touched": {}, "errors": {}}
    return {"outcomes": outcomes, **notes}


def classify(baseline: dict, kvcore: dict, mapping: dict, files=None, ran: str = "touched") -> dict:
    """The table: one category per test that passes on vLLM alone (see the module docstring).
    ``files``: only the tests of these files count (None: all); ``ran``: the adapter's note
    that says kvcore's code ran in a test ("touched": any of kvcore; "scheduler": kvcore's
    Scheduler)."""
    rows, features = {}, Counter()
    attributes = mapping.get("missing_attributes", {})
    tests = mapping.get("tests", {})
    for nodeid, base in sorted(baseline["outcomes"].items()):
        if base != "passed":
            continue
        if files is not None and nodeid.split("::")[0].rsplit("/", 1)[-1] not in files:
            continue
        ours = kvcore["outcomes"].get(nodeid, "failed")
        touched = kvcore.get(ran, {}).get(nodeid, False)
        err = kvcore["errors"].get(nodeid, {})
        if ours == "passed":
            rows[nodeid] = ("passed_kvcore" if touched else "passed_vllm_only", None)
            continue
        feature = err.get("feature") or attributes.get(err.get("missing_attribute") or "")
        feature = feature or tests.get(nodeid.split("[")[0])
        if feature:
            rows[nodeid] = ("not_modelled", feature)
            features[feature] += 1
        else:
            rows[nodeid] = ("behaviour_differs", err)
    counts = Counter(cat for cat, _ in rows.values())
    return {
        "runs_here": len(rows),
        "counts": {c: counts.get(c, 0) for c in CATEGORIES},
        "features": dict(features.most_common()),
        "differs": {k: v[1] for k, v in rows.items() if v[0] == "behaviour_differs"},
        "rows": {k: v[0] for k, v in rows.items()},
    }


def baseline_key(sdist: Path, venv: str, files) -> str:
    """What vLLM alone's outcomes depend on: vLLM's tests (the sdist), the interpreter and packages
    that run them (the environment's pyvenv.cfg and its site-packages folder, which every install
    touches), the adapter and stand-ins as copied, and the files run. Its outcomes are cached
    under this key beside the sdist, so a second run takes only kvcore's pass."""
    h = hashlib.sha256(hashlib.sha256(sdist.read_bytes()).digest())
    for path in (HERE / "conftest.py", HERE / "standin_models.py", Path(venv) / "pyvenv.cfg"):
        h.update(path.read_bytes())
    for site in sorted(Path(venv).glob("lib/python*/site-packages")):
        h.update(f"{site.resolve()}:{site.stat().st_mtime_ns}".encode())
    h.update(json.dumps(list(files)).encode())
    return h.hexdigest()[:16]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", nargs="*", default=list(FILES), help="files of tests/v1/core")
    ap.add_argument("--json", help="also write the table (and every test's row) here")
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per pytest run")
    ap.add_argument(
        "--fresh-baseline",
        action="store_true",
        help="run vLLM alone again even where a baseline for these inputs is cached",
    )
    ap.add_argument(
        "--no-scheduler",
        action="store_true",
        help="skip the second mode (kvcore's own Scheduler under test_scheduler.py)",
    )
    args = ap.parse_args()
    venv = os.environ.get("VLLM_VENV", "/tmp/vllm034-venv")
    venv_python = os.path.join(venv, "bin", "python")
    if not os.path.exists(venv_python):
        print(f"skipped: no vLLM {VERSION} environment at {venv} (bash scripts/vllm_env.sh)")
        return 0
    cache = Path(os.environ.get("VLLM_SDIST_CACHE", "/tmp/vllm-sdist-cache"))
    sdist = fetch_sdist(cache, venv_python)
    pytest_dir = ensure_pytest(cache, venv_python)
    scratch = cache / f"run-{VERSION}"
    prepare(sdist, scratch, venv_python)
    mapping = yaml.safe_load((HERE / "unmodelled.yaml").read_text()) or {}
    kept = cache / f"baseline-{baseline_key(sdist, venv, args.files)}"
    if kept.is_dir() and not args.fresh_baseline:
        for name in ("baseline.xml", "baseline.json"):
            shutil.copy(kept / name, scratch / name)
        baseline = read_results(scratch, "baseline")
    else:
        baseline = run_pytest(venv_python, scratch, pytest_dir, args.files, False, args.timeout)
        part = kept.with_suffix(".part")
        shutil.rmtree(part, ignore_errors=True)
        part.mkdir()
        for name in ("baseline.xml", "baseline.json"):
            shutil.copy(scratch / name, part / name)
        shutil.rmtree(kept, ignore_errors=True)
        part.rename(kept)
    kvcore = run_pytest(venv_python, scratch, pytest_dir, args.files, True, args.timeout)
    table = classify(baseline, kvcore, mapping)
    print(f"vLLM {VERSION} tests/v1/core ({', '.join(args.files)}) against kvcore's block layer")
    print(f"  {len(baseline['outcomes'])} tests collected, {table['runs_here']} pass on vLLM here")
    print_table(table, "kvcore's code ran")
    sched_files = [f for f in args.files if f in SCHEDULER_FILES]
    if sched_files and not args.no_scheduler:
        ours = run_pytest(
            venv_python, scratch, pytest_dir, sched_files, True, args.timeout, scheduler=True
        )
        sched_mapping = {
            "missing_attributes": {
                **mapping.get("missing_attributes", {}),
                **mapping.get("scheduler_missing_attributes", {}),
            },
            "tests": {**mapping.get("tests", {}), **mapping.get("scheduler_tests", {})},
        }
        table["scheduler"] = classify(baseline, ours, sched_mapping, sched_files, "scheduler")
        print(f"vLLM {VERSION} tests/v1/core ({', '.join(sched_files)}) against kvcore's Scheduler")
        print(f"  {table['scheduler']['runs_here']} pass on vLLM here")
        print_table(table["scheduler"], "kvcore's Scheduler ran")
    if args.json:
        Path(args.json).write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    return 1 if table["counts"]["behaviour_differs"] else 0


def print_table(table: dict, ran: str) -> None:
    c = table["counts"]
    print(f"  passed, {ran:24s} {c['passed_kvcore']:5d}")
    print(f"  passed, vLLM's code only         {c['passed_vllm_only']:5d}  (not counted)")
    print(f"  failed: feature not modelled     {c['not_modelled']:5d}")
    for feature, n in table["features"].items():
        print(f"      {n:4d}  {feature}")
    print(f"  failed: behaviour differs        {c['behaviour_differs']:5d}")
    for nodeid, err in list(table["differs"].items())[:60]:
        print(f"      {nodeid}: {err.get('type')}: {err.get('message', '')[:120]}")


if __name__ == "__main__":
    sys.exit(main())
