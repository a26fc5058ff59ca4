"""What if: one trace replayed at several values of one setting, the points in parallel processes
or as Ray tasks.

Each point is an independent replay (same trace, the base settings with one value changed),
so points run in separate processes (spawned: safe beside threads, e.g. under Streamlit), or on
a Ray cluster (``--ray [ADDRESS]``, the optional extra ``ray``), and come back in the order
asked. A point whose settings are refused or whose replay cannot run
comes back with its error instead of a result.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from multiprocessing import get_context
from typing import Any, Callable, Optional

from paged_kv_lab.run.scenario import EngineSettings, ScenarioError
from paged_kv_lab.text.i18n import Text
from paged_kv_lab.workloads.replay import ReplayError, ReplayResult, replay, replay_settings
from paged_kv_lab.workloads.trace_formats import Trace

# Besides any engine setting, these replay settings can be swept.
REPLAY_KEYS = ("speedup", "step_ms", "token_ms")


@dataclass(frozen=True)
class SweepPoint:
    """One value of the swept setting: its replay's figures, or why it did not run."""

    key: str
    value: Any
    result: Optional[ReplayResult]
    error: Optional[str] = None


def parse_sweep(spec: str) -> tuple[str, list[Any]]:
    """``KEY=V1,V2,...`` as (key, values); each value read as JSON (else text). ScenarioError
    names what was wrong."""
    key, sep, raw = spec.partition("=")
    key = key.strip()
    known = {f for f in EngineSettings.__dataclass_fields__} | set(REPLAY_KEYS)
    if not sep or not key or not raw.strip():
        raise ScenarioError([Text("problem.sweep.form", {"spec": repr(spec)})])
    if key not in known:
        at = {"spec": repr(spec), "key": repr(key), "known": ", ".join(sorted(known))}
        raise ScenarioError([Text("problem.sweep.unknown", at)])
    values = []
    for part in raw.split(","):
        part = part.strip()
        if not part:
            raise ScenarioError([Text("problem.sweep.empty", {"spec": repr(spec)})])
        try:
            values.append(json.loads(part))
        except json.JSONDecodeError:
            values.append(part)
    if len(values) != len({json.dumps(v) for v in values}):
        raise ScenarioError([Text("problem.sweep.twice", {"spec": repr(spec)})])
    return key, values


def _point(trace: Trace, overrides: dict, replay_args: dict, key: str, value: Any) -> SweepPoint:
    try:
        args = dict(replay_args)
        if key in REPLAY_KEYS:
            args[key] = value
            settings = replay_settings(trace, overrides, **args)
        else:
            settings = replay_settings(trace, {**overrides, key: value}, **args)
        return SweepPoint(key, value, replay(trace, settings))
    except (ScenarioError, ReplayError, ValueError) as e:
        return SweepPoint(key, value, None, str(e).replace("\n", " "))


def run_points(
    fn: Callable[..., Any],
    jobs: list[tuple],
    workers: Optional[int] = None,
    progress: Optional[Callable[[int, int], None]] = None,
    ray_address: Optional[str] = None,
) -> list[Any]:
    """``fn(*job)`` for every job, results in job order: here (``workers`` 1), in spawned
    processes (default: one per job, at most the CPUs), or as Ray tasks when ``ray_address`` is
    given ("local": a Ray started on this machine; else the address ``ray.init`` takes, e.g.
    "auto" or "ray://head:10001"). ``fn`` and the jobs must pickle; the results are the same
    whichever way they ran (each job is a whole, deterministic replay)."""
    n = len(jobs)
    if ray_address is not None:
        return _run_on_ray(fn, jobs, progress, ray_address)
    if workers is None:
        workers = min(n, os.cpu_count() or 1)
    workers = max(1, min(workers, n))
    if workers == 1:
        out = []
        for i, job in enumerate(jobs):
            out.append(fn(*job))
            if progress is not None:
                progress(i + 1, n)
        return out
    results: list[Any] = [None] * n
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        futures = {pool.submit(fn, *job): i for i, job in enumerate(jobs)}
        for k, fut in enumerate(as_completed(futures), 1):
            results[futures[fut]] = fut.result()
            if progress is not None:
                progress(k, n)
    return results


def _run_on_ray(fn, jobs, progress, address: str) -> list[Any]:
    try:
        import ray
    except ImportError:
        raise ScenarioError(
            ["--ray: Ray is not installed (pip install 'paged-kv-lab[ray]')"]
        ) from None
    if not ray.is_initialized():
        # The workers import this project: ship the working tree unless the cluster has it.
        runtime_env = None
        if address != "local":
            root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
            runtime_env = {"working_dir": root, "excludes": [".git", ".venv", "site"]}
        ray.init(
            address=None if address == "local" else address,
            runtime_env=runtime_env,
            include_dashboard=False,
            log_to_driver=False,
        )
    task = ray.remote(fn)
    refs = [task.remote(*job) for job in jobs]
    index = {ref: i for i, ref in enumerate(refs)}
    results: list[Any] = [None] * len(refs)
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        for ref in ready:
            results[index[ref]] = ray.get(ref)
        if progress is not None:
            progress(len(refs) - len(pending), len(refs))
    return results


def sweep(
    trace: Trace,
    overrides: dict,
    key: str,
    values: list[Any],
    workers: Optional[int] = None,
    progress: Optional[Callable[[int, int], None]] = None,
    ray_address: Optional[str] = None,
    **replay_args: Any,
) -> list[SweepPoint]:
    """Replay ``trace`` once per value of ``key`` (an engine setting or one of ``REPLAY_KEYS``),
    on top of ``overrides``; ``replay_args`` are ``replay_settings``'s arrival arguments.
    ``workers``: processes (default: one per point, at most the CPUs); 1 runs here, in order;
    ``ray_address``: the points as Ray tasks instead (``run_points``)."""
    jobs = [(trace, overrides, replay_args, key, v) for v in values]
    return run_points(_point, jobs, workers, progress, ray_address)
