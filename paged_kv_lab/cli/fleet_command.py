"""``python -m paged_kv_lab fleet``: a trace through N replicas behind a router, model-free.

    python -m paged_kv_lab fleet TRACE [--replicas N] [--router POLICY] [--set KEY=VALUE ...]
                                 [--arrival sequential|timestamps] [--json [PATH]]
                                 [--sweep router=P1,P2,... | --sweep replicas=N1,N2,...]

``--set`` takes engine settings (as ``replay``) and router settings (fleet/router.py's
``router_defaults()``: seed, kv_event_lag_ms, each policy's own, such as Dynamo's and
sglang-router's weights). ``--router`` is any registered policy (fleet/router.py's registry).
``--sweep`` runs each point in its own process and prints one row per point. Exit codes: 0 ok,
1 a sweep point failed, 2 bad trace, settings or arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from paged_kv_lab.cli.replay_command import (
    _progress,
    _write,
    add_clock_arguments,
    add_progress_arguments,
    add_trace_arguments,
)
from paged_kv_lab.run.budget import BudgetError
from paged_kv_lab.run.scenario import ScenarioError, parse_engine_overrides
from paged_kv_lab.text.i18n import Text, languages, said, tr

SWEEP_KEYS = ("router", "replicas")


def add_parser(sub) -> None:
    from paged_kv_lab.fleet.router import policies

    p = sub.add_parser("fleet", help=tr("cli.fleet.help"))
    add_trace_arguments(p)
    p.add_argument("--replicas", type=int, default=4, help=tr("cli.fleet.replicas"))
    p.add_argument("--router", choices=policies(), default="prefix", help=tr("cli.fleet.router"))
    p.add_argument(
        "--set", action="append", metavar="KEY=VALUE", default=[], help=tr("cli.fleet.set")
    )
    p.add_argument(
        "--arrival",
        choices=("sequential", "timestamps"),
        default="sequential",
        help=tr("cli.fleet.arrival"),
    )
    add_clock_arguments(p)
    p.add_argument("--json", nargs="?", const="-", metavar="PATH", help=tr("cli.fleet.json"))
    p.add_argument("--sweep", metavar="KEY=V1,V2,...", help=tr("cli.fleet.sweep"))
    p.add_argument("--workers", type=int, help=tr("cli.replay.workers"))
    p.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS", help=tr("cli.sweep.ray"))
    add_progress_arguments(p)


def split_overrides(overrides: dict) -> tuple[dict, dict]:
    """``--set`` pairs as (engine settings, router settings)."""
    from paged_kv_lab.fleet.router import router_defaults

    known = router_defaults()
    engine = {k: v for k, v in overrides.items() if k not in known}
    router = {k: v for k, v in overrides.items() if k in known}
    return engine, router


def parse_fleet_sweep(spec: str) -> tuple[str, list[Any]]:
    """``router=P1,P2`` or ``replicas=N1,N2`` as (key, values); ScenarioError says what is
    wrong."""
    key, sep, raw = spec.partition("=")
    key = key.strip()
    if not sep or key not in SWEEP_KEYS or not raw.strip():
        raise ScenarioError([Text("problem.fleet_sweep.form", {"spec": repr(spec)})])
    parts = [v.strip() for v in raw.split(",")]
    if any(not v for v in parts) or len(set(parts)) != len(parts):
        raise ScenarioError([Text("problem.fleet_sweep.values", {"spec": repr(spec)})])
    if key == "replicas":
        try:
            return key, [int(v) for v in parts]
        except ValueError:
            raise ScenarioError(
                [Text("problem.fleet_sweep.replicas", {"spec": repr(spec)})]
            ) from None
    return key, parts


def run_point(trace, engine: dict, router: dict, replay_args: dict, replicas: int, policy: str):
    """One fleet run: (result as a dict, None) or (None, why it could not run)."""
    from paged_kv_lab.fleet.router import RouterError
    from paged_kv_lab.fleet.trace_fleet import fleet_replay
    from paged_kv_lab.workloads.replay import ReplayError, replay_settings

    try:
        settings = replay_settings(trace, engine, **replay_args)
        return fleet_replay(trace, settings, replicas, policy, router).to_dict(), None
    except (ScenarioError, ReplayError, RouterError) as e:
        return None, str(e).replace("\n", " ")


def _pct(x: float) -> str:
    return f"{x:.1%}"


def fleet_table(d: dict) -> str:
    s = d["settings"]["engine"]
    lines = [
        f"fleet of {d['num_replicas']} behind {d['router']} over {d['trace']} "
        f"({d['requests']:,} requests, arrival {d['settings']['arrival']}; block_size "
        f"{s['block_size']}, num_gpu_blocks {s['num_gpu_blocks']:,} per replica)",
        f"hit tokens {d['hit_tokens']:,} of {d['queries']:,} queried (hit rate "
        f"{_pct(d['hit_rate'])}); evictions {d['evictions']:,}; preemptions "
        f"{d['preemptions']:,}; KV events read by the router: {d['kv_events']['events']:,} in "
        f"{d['kv_events']['batches']:,} batches",
    ]
    head = ("replica", "requests", "hit rate", "hit tokens", "peak usage", "evictions")
    rows = [
        (
            str(r["replica"]),
            f"{r['requests']:,}",
            _pct(r["hit_rate"]),
            f"{r['hit_tokens']:,}",
            _pct(r["peak_usage"]),
            f"{r['evictions']:,}",
        )
        for r in d["replicas"]
    ]
    lines += _columns(head, rows)
    return "\n".join(lines) + "\n"


def _columns(head, rows) -> list[str]:
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    return ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in [head, *rows]]


def sweep_table(key: str, points: list[dict]) -> str:
    head = (
        "router" if key == "router" else "replicas",
        "hit rate",
        "hit tokens",
        "evictions",
        "preemptions",
        "requests per replica",
    )
    rows = []
    for p in points:
        d = p["result"]
        if d is None:
            rows.append((str(p["value"]), "error: " + p["error"], "", "", "", ""))
            continue
        rows.append(
            (
                str(p["value"]),
                _pct(d["hit_rate"]),
                f"{d['hit_tokens']:,}",
                f"{d['evictions']:,}",
                f"{d['preemptions']:,}",
                " ".join(str(r["requests"]) for r in d["replicas"]),
            )
        )
    return "\n".join(_columns(head, rows)) + "\n"


def cmd_fleet(args: argparse.Namespace) -> int:
    from paged_kv_lab.fleet.router import RouterError, router_settings
    from paged_kv_lab.workloads import SHIPPED_TRACE
    from paged_kv_lab.workloads.replay import replay_settings
    from paged_kv_lab.workloads.trace_formats import TraceError, load_trace
    from paged_kv_lab.workloads.trace_limits import check_trace, cli_trace_limits

    try:
        trace = load_trace(args.trace or SHIPPED_TRACE, args.format)
        if args.requests is not None:
            if args.requests < 1:
                raise ScenarioError([Text("problem.cli.requests", {"got": args.requests})])
            trace = trace.slice(0, args.requests)
        engine, router = split_overrides(parse_engine_overrides(args.set))
        router_settings(router)
        replay_args = dict(
            arrival=args.arrival, speedup=args.speedup, step_ms=args.step_ms, token_ms=args.token_ms
        )
        settings = replay_settings(trace, engine, **replay_args)
        check_trace(trace, settings, cli_trace_limits())
        key, values = parse_fleet_sweep(args.sweep) if args.sweep else (None, None)
    except (TraceError, ScenarioError, BudgetError, RouterError, OSError) as e:
        print(f"error: {said(e, args.lang)}", file=sys.stderr)
        return 2
    out = sys.stderr if args.json == "-" else sys.stdout
    if key is None:
        bar = _progress(args, "fleet", " requests")
        from paged_kv_lab.fleet.trace_fleet import fleet_replay
        from paged_kv_lab.workloads.replay import ReplayError

        try:
            d = fleet_replay(trace, settings, args.replicas, args.router, router, bar).to_dict()
        except (ReplayError, RouterError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        out.write(fleet_table(d))
        if args.json:
            _write(args.json, json.dumps(d) + "\n")
        return 0
    jobs = [(args.replicas, v) if key == "router" else (v, args.router) for v in values]
    from paged_kv_lab.workloads.sweep import run_points

    try:
        results = run_points(
            run_point,
            [(trace, engine, router, replay_args, n, p) for n, p in jobs],
            args.workers,
            _progress(args, f"sweep {key}", " points"),
            args.ray,
        )
    except ScenarioError as e:
        print(f"error: {said(e, args.lang)}", file=sys.stderr)
        return 2
    points = [{"value": v, "result": res, "error": err} for v, (res, err) in zip(values, results)]
    out.write(f"sweep {key} over {trace.name} ({len(trace):,} requests, arrival {args.arrival})\n")
    out.write(sweep_table(key, points))
    if args.json:
        _write(args.json, json.dumps({"key": key, "points": points}) + "\n")
    return 0 if all(p["error"] is None for p in points) else 1


def add_serve_parser(sub) -> None:
    from paged_kv_lab.fleet.demo_publisher import DEFAULT_PACE_MS
    from paged_kv_lab.fleet.router import policies

    p = sub.add_parser("serve-events", help=tr("cli.serve.help"))
    p.add_argument("trace", nargs="?", metavar="SCENARIO|TRACE", help=tr("cli.serve.source"))
    p.add_argument("--lang", choices=tuple(languages()), default="en", help=tr("cli.replay.lang"))
    p.add_argument("--requests", type=int, default=60, metavar="N", help=tr("cli.serve.requests"))
    p.add_argument("--replicas", type=int, default=1, help=tr("cli.serve.replicas"))
    p.add_argument("--router", choices=policies(), default="prefix", help=tr("cli.fleet.router"))
    p.add_argument(
        "--set", action="append", metavar="KEY=VALUE", default=[], help=tr("cli.fleet.set")
    )
    p.add_argument("--endpoint", default="tcp://127.0.0.1:5557", help=tr("cli.serve.endpoint"))
    p.add_argument("--replay-endpoint", default="tcp://127.0.0.1:5657", help=tr("cli.serve.replay"))
    p.add_argument("--topic", default="", help=tr("cli.run.kv_events_topic"))
    p.add_argument("--pace-ms", type=float, default=DEFAULT_PACE_MS, help=tr("cli.serve.pace"))
    p.add_argument("--linger-s", type=float, default=600.0, help=tr("cli.serve.linger"))
    p.add_argument("--check", action="store_true", help=tr("cli.run.check"))


def cmd_serve_events(args: argparse.Namespace) -> int:
    if args.trace and args.trace.endswith(".json"):  # a scenario: the real model in the loop
        return serve_scenario(args)
    from paged_kv_lab.fleet.router import RouterError
    from paged_kv_lab.fleet.trace_fleet import trace_fleet
    from paged_kv_lab.workloads import SHIPPED_TRACE
    from paged_kv_lab.workloads.replay import ReplayError, replay_settings
    from paged_kv_lab.workloads.trace_formats import TraceError, load_trace
    from paged_kv_lab.workloads.trace_limits import check_trace, cli_trace_limits

    try:
        trace = load_trace(args.trace or SHIPPED_TRACE)
        if args.requests < 1:
            raise ScenarioError([Text("problem.cli.requests", {"got": args.requests})])
        trace = trace.slice(0, args.requests)
        overrides = {"block_size": 512, "num_gpu_blocks": 300, **parse_engine_overrides(args.set)}
        engine, router = split_overrides(overrides)
        settings = replay_settings(trace, engine, arrival="timestamps")
        check_trace(trace, settings, cli_trace_limits())
        fleet = trace_fleet(trace, settings, args.replicas, args.router, router)
    except (TraceError, ScenarioError, BudgetError, RouterError, ReplayError, OSError) as e:
        print(f"error: {said(e, args.lang)}", file=sys.stderr)
        return 2
    return publish(fleet, args)


def serve_scenario(args: argparse.Namespace) -> int:
    """``serve-events SCENARIO.json``: the scenario on its model, as ``kvcore run`` steps it (one
    replica), or routed request by request over ``--replicas`` engines sharing the weights
    (fleet/model_fleet.py: the one fleet, engines as its drivers); each replica's KV events
    published as by a trace."""
    from kvcore.config.kv_events import KVEventsConfig
    from paged_kv_lab.cli.main import open_engine
    from paged_kv_lab.fleet.demo_publisher import EngineFeed
    from paged_kv_lab.fleet.model_fleet import model_fleet
    from paged_kv_lab.fleet.router import RouterError
    from paged_kv_lab.run.scenario import load_scenario, with_engine_overrides

    args.scenario = args.trace
    try:
        from paged_kv_lab.fleet.trace_fleet import MAX_REPLICAS

        if not 1 <= args.replicas <= MAX_REPLICAS:
            raise ScenarioError(
                [Text("problem.serve.replicas", {"got": args.replicas, "max": MAX_REPLICAS})]
            )
        engine_set, router_set = split_overrides(parse_engine_overrides(args.set))
        scenario = load_scenario(args.trace)
        if engine_set:
            scenario = with_engine_overrides(scenario, engine_set)
    except ScenarioError as e:
        print(f"error: {args.trace}: {said(e, args.lang)}", file=sys.stderr)
        return 2
    # published by DemoSource's sockets, not the engine's: the engine only drains its batches
    wire = KVEventsConfig(enable_kv_cache_events=True, publisher="null")
    opened = open_engine(args, scenario, wire)
    if isinstance(opened, int):
        return opened
    scenario, engine = opened
    try:
        if args.replicas == 1:
            feed = EngineFeed(engine)
        else:
            engine.close()
            feed = model_fleet(scenario, args.replicas, args.router, engine.model, None, router_set)
    except (RouterError, ValueError) as e:
        print(f"error: {args.trace}: {said(e, args.lang)}", file=sys.stderr)
        return 2
    return publish(feed, args)


def publish(fleet, args: argparse.Namespace) -> int:
    """Publish ``fleet``'s KV events (fleet/demo_publisher.py's DemoSource) here until it is done
    and its
    linger is over (or Ctrl-C), after printing the command that watches it."""
    from paged_kv_lab.fleet.demo_publisher import DemoSource

    try:
        replay = args.replay_endpoint or None
        source = DemoSource(fleet, args.endpoint, replay, args.topic, args.pace_ms, args.linger_s)
    except Exception as e:  # a ZeroMQ refusal (address in use, bad endpoint)
        print(f"error: {e}", file=sys.stderr)
        return 2
    watch = (
        f"python -m paged_kv_lab watch {args.endpoint} --bind --data-parallel-size {args.replicas}"
    )
    if args.replay_endpoint:
        watch += f" --replay {args.replay_endpoint}"
    if args.topic:
        watch += f" --topic {args.topic}"
    print(tr("cli.serve.started", args.lang, endpoints=", ".join(source.endpoints), watch=watch))
    sys.stdout.flush()
    try:
        source.run()
    except KeyboardInterrupt:
        pass
    finally:
        source.stop()
    print(tr("cli.serve.done", args.lang, batches=source.sent))
    return 0
