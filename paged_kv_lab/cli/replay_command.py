"""``python -m paged_kv_lab replay``: a production trace through the engine, model-free.

    python -m paged_kv_lab replay TRACE [--set KEY=VALUE ...] [--arrival sequential|timestamps]
                                  [--speedup X] [--json [PATH]] [--sweep KEY=V1,V2,...]
                                  [--csv [PATH]] [--unbounded]

The figures go to stdout as a table (to stderr when the JSON goes to stdout); ``--json``
writes ReplayResult.to_dict() (``-`` or no path: stdout). ``--sweep`` replays every value in
parallel processes and prints one row per value; with ``num_gpu_blocks`` swept under
sequential arrival it adds the one-pass answer (workloads/bound.py). Exit codes: 0 ok, 2 bad
trace, settings or arguments.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from typing import Optional

from paged_kv_lab.run.budget import BudgetError
from paged_kv_lab.run.scenario import ScenarioError, parse_engine_overrides
from paged_kv_lab.text.i18n import Text, languages, said, tr


def add_trace_arguments(p) -> None:
    """The trace file, the log's language and the trace's format (replay and fleet alike)."""
    p.add_argument("trace", nargs="?", help=tr("cli.replay.trace"))
    p.add_argument("--lang", choices=tuple(languages()), default="en", help=tr("cli.replay.lang"))
    p.add_argument(
        "--format",
        choices=("auto", "mooncake", "qwen-bailian"),
        default="auto",
        help=tr("cli.replay.format"),
    )


def add_clock_arguments(p) -> None:
    """The replay's clock (timestamps arrival) and how many of the trace's requests to take."""
    p.add_argument("--speedup", type=float, default=1.0, help=tr("cli.replay.speedup"))
    p.add_argument("--step-ms", type=float, default=10.0, help=tr("cli.replay.step_ms"))
    p.add_argument("--token-ms", type=float, default=0.05, help=tr("cli.replay.token_ms"))
    p.add_argument("--requests", type=int, metavar="N", help=tr("cli.replay.requests"))


def add_progress_arguments(p) -> None:
    """--progress / --no-progress (default: a bar when stderr is a terminal)."""
    bar = p.add_mutually_exclusive_group()
    bar.add_argument("--progress", action="store_true", help=tr("cli.replay.progress"))
    bar.add_argument("--no-progress", action="store_true", help=tr("cli.replay.no_progress"))


def add_parser(sub) -> None:
    p = sub.add_parser("replay", help=tr("cli.replay.help"))
    add_trace_arguments(p)
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        default=[],
        help=tr("cli.replay.set"),
    )
    p.add_argument(
        "--arrival",
        choices=("sequential", "timestamps"),
        default="sequential",
        help=tr("cli.replay.arrival"),
    )
    add_clock_arguments(p)
    p.add_argument(
        "--json",
        nargs="?",
        const="-",
        metavar="PATH",
        help=tr("cli.replay.json"),
    )
    p.add_argument(
        "--series-points",
        type=int,
        default=1000,
        help=tr("cli.replay.series_points"),
    )
    p.add_argument(
        "--sweep",
        metavar="KEY=V1,V2,...",
        help=tr("cli.replay.sweep"),
    )
    p.add_argument("--csv", nargs="?", const="-", metavar="PATH", help=tr("cli.replay.csv"))
    p.add_argument("--workers", type=int, help=tr("cli.replay.workers"))
    p.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS", help=tr("cli.sweep.ray"))
    p.add_argument(
        "--unbounded",
        action="store_true",
        help=tr("cli.replay.unbounded"),
    )
    p.add_argument(
        "--no-fast-forward",
        action="store_true",
        help=tr("cli.replay.no_fast_forward"),
    )
    add_progress_arguments(p)


class ProgressBar:
    """``progress(done, total)`` drawn by tqdm on stderr (as it is at the first report, when the
    total is known); the bar is removed once done reaches total, so the table follows on a clean
    line."""

    def __init__(self, label: str, unit: str) -> None:
        self.label, self.unit = label, unit
        self.bar = None

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(
                desc=self.label, total=total, unit=self.unit, leave=False, mininterval=0.2
            )
        self.bar.update(done - self.bar.n)
        if done >= total:
            self.bar.close()


def _progress(args, label: str, unit: str) -> Optional[ProgressBar]:
    if args.no_progress:
        return None
    if args.progress or sys.stderr.isatty():
        return ProgressBar(label, unit)
    return None


def _pct(x: Optional[float]) -> str:
    return "—" if x is None else f"{x:.1%}"


def result_table(result, unbounded=None) -> str:
    s = result.settings["engine"]
    rows = [
        ("trace", f"{result.trace} ({result.format}, {result.requests:,} requests)"),
        (
            "settings",
            f"block_size {s['block_size']}, num_gpu_blocks {s['num_gpu_blocks']:,}, "
            f"max_num_seqs {s['max_num_seqs']}, max_num_batched_tokens "
            f"{s['max_num_batched_tokens']:,}, arrival {result.settings['arrival']}",
        ),
        ("prompt tokens", f"{result.prompt_tokens:,}"),
        ("hit tokens", f"{result.hit_tokens:,}  (hit rate {_pct(result.hit_rate)})"),
        (
            "preempted",
            f"{result.preempted_requests:,} resumed requests, {result.preempted_queries:,} "
            f"tokens queried, {result.preempted_hits:,} hit (counted apart, as vLLM)",
        ),
        ("evictions", f"{result.evictions:,} blocks"),
        ("preemptions", f"{result.preemptions:,}"),
        (
            "infinite cache",
            f"{result.upper_bound_hit_tokens:,} hit tokens  "
            f"(hit rate {_pct(result.upper_bound_hit_rate)}; the upper bound)",
        ),
        (
            "steps",
            f"{result.steps:,} ({result.fast_forwarded_steps:,} fast-forwarded), "
            f"{result.simulated_s:,.1f} s simulated",
        ),
        (
            "wall time",
            f"{result.wall_s:.2f} s ({result.requests / max(result.wall_s, 1e-9):,.0f} requests/s)",
        ),
    ]
    if unbounded is not None:
        rows.append(("unbounded pool", _unbounded_line(unbounded)))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows) + "\n"


def _unbounded_line(ans) -> str:
    if ans.hit_tokens is None:
        return f"not computed: {ans.why}"
    line = (
        f"hit rate {_pct(ans.hit_rate)}, reached from num_gpu_blocks = "
        f"{ans.smallest_num_gpu_blocks:,} ({'exact' if ans.exact else 'enough'}; one pass)"
    )
    return line + (f"; {ans.why}" if ans.why else "")


CSV_FIELDS = (
    "key",
    "value",
    "requests",
    "prompt_tokens",
    "hit_tokens",
    "hit_rate",
    "evictions",
    "preemptions",
    "preempted_requests",
    "steps",
    "simulated_s",
    "wall_s",
    "error",
)


def sweep_rows(points) -> list[dict]:
    rows = []
    for p in points:
        r = p.result
        row = {"key": p.key, "value": p.value, "error": p.error or ""}
        if r is not None:
            row.update(
                requests=r.requests,
                prompt_tokens=r.prompt_tokens,
                hit_tokens=r.hit_tokens,
                hit_rate=round(r.hit_rate, 6),
                evictions=r.evictions,
                preemptions=r.preemptions,
                preempted_requests=r.preempted_requests,
                steps=r.steps,
                simulated_s=round(r.simulated_s, 3),
                wall_s=round(r.wall_s, 3),
            )
        rows.append(row)
    return rows


def sweep_table(rows: list[dict]) -> str:
    head = ("value", "hit rate", "hit tokens", "evictions", "preemptions", "steps", "wall s")
    body = []
    for row in rows:
        if row["error"]:
            body.append((str(row["value"]), f"error: {row['error']}", "", "", "", "", ""))
            continue
        body.append(
            (
                str(row["value"]),
                _pct(row["hit_rate"]),
                f"{row['hit_tokens']:,}",
                f"{row['evictions']:,}",
                f"{row['preemptions']:,}",
                f"{row['steps']:,}",
                f"{row['wall_s']:.1f}",
            )
        )
    ok = [head] + [r for r in body if not r[1].startswith("error:")]
    widths = [max(len(r[i]) for r in ok) for i in range(7)]
    widths[0] = max(widths[0], *(len(r[0]) for r in body))
    lines = ["  ".join(h.rjust(w) for h, w in zip(head, widths))]
    for r in body:
        if r[1].startswith("error:"):
            lines.append(f"{r[0].rjust(widths[0])}  {r[1]}")
        else:
            lines.append("  ".join(c.rjust(w) for c, w in zip(r, widths)))
    return "\n".join(lines) + "\n"


def _write(path: str, text: str) -> None:
    if path == "-":
        sys.stdout.write(text)
    else:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)


def cmd_replay(args: argparse.Namespace) -> int:
    from paged_kv_lab.workloads import SHIPPED_TRACE
    from paged_kv_lab.workloads.bound import unbounded_answer
    from paged_kv_lab.workloads.replay import ReplayError, replay_settings
    from paged_kv_lab.workloads.sweep import parse_sweep
    from paged_kv_lab.workloads.trace_formats import TraceError, load_trace
    from paged_kv_lab.workloads.trace_limits import check_trace, cli_trace_limits

    limits = cli_trace_limits()
    try:
        trace = load_trace(args.trace or SHIPPED_TRACE, args.format, max_requests=None)
        if args.requests is not None:
            if args.requests < 1:
                raise ScenarioError([Text("problem.cli.requests", {"got": args.requests})])
            trace = trace.slice(0, args.requests)
        overrides = parse_engine_overrides(args.set)
        arrival = dict(
            arrival=args.arrival,
            speedup=args.speedup,
            step_ms=args.step_ms,
            token_ms=args.token_ms,
            fast_forward=not args.no_fast_forward,
        )
        settings = replay_settings(trace, overrides, **arrival)
        check_trace(trace, settings, limits)
        sweep_key = sweep_values = None
        if args.sweep:
            sweep_key, sweep_values = parse_sweep(args.sweep)
        elif args.csv:
            raise ScenarioError([Text("problem.cli.csv_needs_sweep")])
    except (TraceError, ScenarioError, BudgetError, OSError) as e:
        print(f"error: {said(e, args.lang)}", file=sys.stderr)
        return 2
    table_out = sys.stderr if args.json == "-" or args.csv == "-" else sys.stdout
    try:
        if sweep_key is not None:
            return _cmd_sweep(
                args,
                trace,
                overrides,
                arrival,
                settings,
                sweep_key,
                sweep_values,
                table_out,
                limits,
            )
        from paged_kv_lab.workloads.replay import Replay

        run = Replay(trace, settings)
        run.advance(progress=_progress(args, "replay", " requests"))
        result = run.result()
        ans = unbounded_answer(trace, settings) if args.unbounded else None
    except ReplayError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    table_out.write(result_table(result, ans))
    if args.json:
        d = result.to_dict(args.series_points)
        if ans is not None:
            d["unbounded"] = ans.to_dict()
        _write(args.json, json.dumps(d) + "\n")
    return 0


def _cmd_sweep(args, trace, overrides, arrival, settings, key, values, out, limits) -> int:
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from paged_kv_lab.workloads.bound import unbounded_answer, why_not_exact
    from paged_kv_lab.workloads.replay import replay_settings
    from paged_kv_lab.workloads.sweep import REPLAY_KEYS, sweep
    from paged_kv_lab.workloads.trace_limits import check_trace

    # Every point must pass the budget before any runs.
    for v in values:
        if key in REPLAY_KEYS:
            continue
        try:
            check_trace(trace, replay_settings(trace, {**overrides, key: v}, **arrival), limits)
        except BudgetError as e:
            print(f"error: --sweep {key}={v}: {said(e, args.lang)}", file=sys.stderr)
            return 2
        except ScenarioError:
            pass  # reported in the point's row
    want_bound = key == "num_gpu_blocks" or args.unbounded
    ans = None
    extra = None
    if want_bound and not why_not_exact(settings):
        extra = ProcessPoolExecutor(1, mp_context=get_context("spawn"))
        future = extra.submit(unbounded_answer, trace, settings)
    try:
        points = sweep(
            trace,
            overrides,
            key,
            values,
            workers=args.workers,
            progress=_progress(args, f"sweep {key}", " points"),
            ray_address=args.ray,
            **arrival,
        )
        if extra is not None:
            ans = future.result()
    finally:
        if extra is not None:
            extra.shutdown()
    if want_bound and ans is None:
        from paged_kv_lab.workloads.bound import UnboundedAnswer

        ans = UnboundedAnswer(None, trace.prompt_tokens, None, False, why_not_exact(settings))
    rows = sweep_rows(points)
    out.write(f"sweep {key} over {trace.name} ({len(trace):,} requests, arrival {args.arrival})\n")
    out.write(sweep_table(rows))
    if ans is not None:
        out.write(f"unbounded pool: {_unbounded_line(ans)}\n")
    if args.csv:
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=CSV_FIELDS + ("note",), lineterminator="\n")
        w.writeheader()
        for row in rows:
            w.writerow(row)
        if ans is not None and ans.hit_tokens is not None:
            w.writerow(
                {
                    "key": "num_gpu_blocks",
                    "value": ans.smallest_num_gpu_blocks,
                    "requests": len(trace),
                    "prompt_tokens": trace.prompt_tokens,
                    "hit_tokens": ans.hit_tokens,
                    "hit_rate": round(ans.hit_rate, 6),
                    "note": "one pass: the smallest pool reaching the unbounded hit rate"
                    + (" (exact)" if ans.exact else " (enough; " + ans.why + ")"),
                }
            )
        _write(args.csv, buf.getvalue())
    if args.json:
        d = {
            "key": key,
            "points": [
                {
                    "value": p.value,
                    "error": p.error,
                    "result": None if p.result is None else p.result.to_dict(args.series_points),
                }
                for p in points
            ],
            "unbounded": None if ans is None else ans.to_dict(),
        }
        _write(args.json, json.dumps(d) + "\n")
    return 0 if all(p.error is None for p in points) else 1
