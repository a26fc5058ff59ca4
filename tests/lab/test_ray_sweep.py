"""Sweeps as Ray tasks (``--ray``) give the same results as local sweeps: a replay sweep, a fleet
sweep and a designs comparison sweep on the test slice, on a local Ray with 2 CPUs.

Ray is an optional extra (``pip install 'paged-kv-lab[ray]'``). The check runs here when ray
imports; otherwise in a scratch environment that has it (``RAY_VENV``, default /tmp/ray-venv,
whose interpreter also finds this project's dependencies); otherwise it is skipped, with the
reason.
"""

import importlib.util
import os
import subprocess
import sys

import pytest

from support.paths import ROOT

SLICE = ROOT / "tests" / "fixtures" / "traces" / "mooncake_slice.jsonl"

CHECK = f"""
import json, sys
from paged_kv_lab.cli.fleet_command import run_point
from paged_kv_lab.workloads.sweep import run_points, sweep
from paged_kv_lab.workloads.trace_formats import load_trace
from support.paths import ROOT

trace = load_trace({str(SLICE)!r}).slice(0, 16)
small = {{"block_size": 512}}
args = {{"arrival": "timestamps"}}

def strip(d):
    d = dict(d)
    d.pop("wall_s", None)
    return d

def replay_points(**kw):
    pts = sweep(trace, small, "num_gpu_blocks", [140, 200], **kw, **args)
    return [(p.value, p.error, p.result and strip(p.result.to_dict())) for p in pts]

def fleet_points(**kw):
    jobs = [(trace, {{**small, "num_gpu_blocks": 140}}, {{}}, args, 3, p)
            for p in ("round_robin", "prefix", "dynamo")]
    return [(strip(d), e) for d, e in run_points(run_point, jobs, **kw)]

def compare_points(**kw):
    from paged_kv_lab.cli.compare_command import sweep_point
    from paged_kv_lab.designs.three_designs import DESIGNS

    jobs = [(trace, small, "sequential", v, DESIGNS, None) for v in (140, 200)]
    return run_points(sweep_point, jobs, **kw)

local = (replay_points(workers=1), fleet_points(workers=1), compare_points(workers=1))
import ray
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
on_ray = (
    replay_points(ray_address="local"),
    fleet_points(ray_address="local"),
    compare_points(ray_address="local"),
)
ray.shutdown()
assert local == on_ray, "ray and local sweeps differ"
assert all(e is None for _, e, _ in local[0]) and all(e is None for _, e in local[1])
assert local[1][1][0]["hit_tokens"] > local[1][0][0]["hit_tokens"]  # prefix beats round robin
print("SAME", len(local[0]), len(local[1]), len(local[2]))
"""


def _ray_python() -> tuple[list[str], dict] | None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if importlib.util.find_spec("ray") is not None:
        return [sys.executable], env
    venv = os.environ.get("RAY_VENV", "/tmp/ray-venv")
    py = os.path.join(venv, "bin", "python")
    if not os.path.isfile(py):
        return None
    probe = subprocess.run(
        [py, "-c", "import ray, msgspec, pydantic, zmq, paged_kv_lab"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        timeout=120,
    )
    return ([py], env) if probe.returncode == 0 else None


def test_ray_sweeps_equal_local_sweeps():
    found = _ray_python()
    if found is None:
        pytest.skip(
            "ray is not installed: pip install 'paged-kv-lab[ray]' (or a scratch environment "
            "with ray in RAY_VENV, default /tmp/ray-venv)"
        )
    cmd, env = found
    proc = subprocess.run(
        [*cmd, "-c", CHECK], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "SAME 2 3 2" in proc.stdout
