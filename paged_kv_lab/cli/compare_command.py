"""``python -m paged_kv_lab compare``: one trace through vLLM's, SGLang's and nano-vllm's caches.

    python -m paged_kv_lab compare TRACE [--designs vllm,sglang,nano] [--set KEY=VALUE ...]
                                   [--page-size N] [--requests N] [--json [PATH]]
                                   [--sweep num_gpu_blocks=V1,V2,...]
                                   [--nanovllm-commit bb823b3|2f352ae]

Every design gets the same requests, arrival rule, settings and KV memory in tokens
(num_gpu_blocks x block_size); see designs/three_designs.py. Exit codes: 0 ok, 2 bad trace, settings
or arguments.
"""

from __future__ import annotations

import argparse
import json
import sys

from paged_kv_lab.designs.nanovllm import HEAD
from paged_kv_lab.run.budget import BudgetError
from paged_kv_lab.run.scenario import ScenarioError, parse_engine_overrides
from paged_kv_lab.text.i18n import Text, languages, said, tr


def add_parser(sub) -> None:
    p = sub.add_parser("compare", help=tr("cli.compare.help"))
    p.add_argument("trace", help=tr("cli.compare.trace"))
    p.add_argument("--lang", choices=tuple(languages()), default="en", help=tr("cli.compare.lang"))
    p.add_argument(
        "--designs",
        default="vllm,sglang,nano",
        help=tr("cli.compare.designs"),
    )
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        default=[],
        help=tr("cli.compare.set"),
    )
    p.add_argument("--page-size", type=int, help=tr("cli.compare.page_size"))
    p.add_argument(
        "--nanovllm-commit",
        default="bb823b3",
        metavar="COMMIT",
        help=tr("cli.compare.nanovllm_commit"),
    )
    p.add_argument(
        "--arrival",
        choices=("sequential", "timestamps"),
        default="sequential",
        help=tr("cli.compare.arrival"),
    )
    p.add_argument("--requests", type=int, metavar="N", help=tr("cli.compare.requests"))
    p.add_argument("--json", nargs="?", const="-", metavar="PATH", help=tr("cli.compare.json"))
    p.add_argument(
        "--sweep",
        metavar="num_gpu_blocks=V1,V2,...",
        help=tr("cli.compare.sweep"),
    )
    p.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS", help=tr("cli.sweep.ray"))


def sweep_point(
    trace, overrides: dict, arrival: str, value: int, designs, page_size, nano_commit: str = HEAD
) -> dict:
    """One pool size of ``--sweep`` (a Ray task with ``--ray``): its row of the curves."""
    from paged_kv_lab.designs.three_designs import compare, sweep_row
    from paged_kv_lab.workloads.replay import replay_settings

    settings = replay_settings(trace, {**overrides, "num_gpu_blocks": value}, arrival=arrival)
    return sweep_row(value, compare(trace, settings, designs, page_size, nano_commit))


def _table(res: dict) -> str:
    lines = [
        f"{res['trace']}: {res['requests']:,} requests, KV memory {res['kv_tokens']:,} tokens "
        f"(block_size {res['block_size']}, SGLang page_size {res['page_size']}), "
        f"arrival {res['arrival']}",
        f"{'design':<17} {'hit rate':>9} {'hit tokens':>14} {'evictions':>10}",
    ]
    for r in res["designs"].values():
        if "error" in r:
            lines.append(f"{r['name']:<17} error: {r['error']}")
        else:
            lines.append(
                f"{r['name']:<17} {r['hit_rate']:>9.1%} {r['hit_tokens']:>14,} "
                f"{r['evictions']:>10,}"
            )
    return "\n".join(lines) + "\n"


def cmd_compare(args: argparse.Namespace) -> int:
    from paged_kv_lab.designs.three_designs import (
        CompareError,
        compare,
        parse_designs,
        parse_nano_commit,
    )
    from paged_kv_lab.workloads.replay import ReplayError, replay_settings
    from paged_kv_lab.workloads.trace_formats import TraceError, load_trace
    from paged_kv_lab.workloads.trace_limits import check_trace, cli_trace_limits

    try:
        designs = parse_designs(args.designs)
        nano_commit = parse_nano_commit(args.nanovllm_commit)
        trace = load_trace(args.trace)
        if args.requests is not None:
            if args.requests < 1:
                raise ScenarioError([Text("problem.cli.requests", {"got": args.requests})])
            trace = trace.slice(0, args.requests)
        overrides = parse_engine_overrides(args.set)
        settings = replay_settings(trace, overrides, arrival=args.arrival)
        check_trace(trace, settings, cli_trace_limits())
        values = None
        if args.sweep:
            key, _, text = args.sweep.partition("=")
            if key.strip() != "num_gpu_blocks" or not text:
                raise CompareError("sweep_form")
            try:
                values = [int(v) for v in text.split(",") if v.strip()]
            except ValueError:
                raise CompareError("sweep_whole", got=repr(text)) from None
            for v in values:
                check_trace(
                    trace,
                    replay_settings(trace, {**overrides, "num_gpu_blocks": v}),
                    cli_trace_limits(),
                )
        if args.arrival != "sequential" and designs != ("vllm",):
            raise CompareError("timestamps")
        if values is None:
            res = compare(trace, settings, designs, args.page_size, nano_commit)
        else:
            from paged_kv_lab.workloads.sweep import run_points

            jobs = [
                (trace, overrides, args.arrival, v, designs, args.page_size, nano_commit)
                for v in values
            ]
            # in order, here, unless --ray: one task per pool size
            rows = run_points(sweep_point, jobs, 1, None, args.ray)
    except (TraceError, ScenarioError, BudgetError, CompareError, ReplayError, OSError) as e:
        print(f"error: {said(e, args.lang)}", file=sys.stderr)
        return 2
    out = sys.stderr if args.json == "-" else sys.stdout
    if values is None:
        out.write(_table(res))
        payload = res
    else:
        head = "num_gpu_blocks  kv tokens  " + "  ".join(f"{d:>8}" for d in designs)
        out.write(
            head + (f"   (nano: nano-vllm {nano_commit})" if "nano" in designs else "") + "\n"
        )
        for row in rows:
            cells = "  ".join(f"{'—':>8}" if row[d] is None else f"{row[d]:>8.1%}" for d in designs)
            out.write(f"{row['num_gpu_blocks']:>14,}  {row['kv_tokens']:>9,}  {cells}\n")
        payload = {
            "trace": trace.name,
            "sweep": "num_gpu_blocks",
            "nano_commit": nano_commit,
            "curves": rows,
        }
    if args.json:
        text = json.dumps(payload) + "\n"
        if args.json == "-":
            sys.stdout.write(text)
        else:
            with open(args.json, "w", encoding="utf-8") as f:
                f.write(text)
    return 0
