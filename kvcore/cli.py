"""Command line: replay a scenario step by step.

    python -m kvcore run SCENARIO.json [--trace OUT.jsonl] [--until EVENT] [--model M] [--device D]

Exit codes: 0 ok, 2 bad scenario or arguments, 3 model or device unavailable.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import TextIO

from kvcore import events, snapshot, trace
from kvcore.scenario import MODELS, DEVICES, ScenarioError, load_scenario, scenario_to_dict


def describe(ev: events.Event) -> str:
    """One log line per event, with its reason."""
    d = ev.data
    who = f"[{ev.request_id}] " if ev.request_id else ""
    grp = f" (group {ev.group})" if ev.group is not None and ev.kind in (
        events.ALLOCATED, events.CACHED, events.FREED, events.TOUCHED, events.WINDOW_SKIPPED) else ""
    ids = list(ev.block_ids)
    k = ev.kind
    if k == events.ARRIVED:
        return f"{who}arrived with {d.get('num_prompt_tokens')} prompt tokens (priority {d.get('priority')})"
    if k == events.CACHE_HIT:
        return f"{who}prefix-cache hit: {d.get('num_blocks')} blocks = {d.get('num_tokens')} tokens {d.get('block_ids_per_group')}"
    if k == events.CACHE_MISS:
        return f"{who}prefix-cache miss ({d.get('num_full_blocks')} full blocks looked up)"
    if k == events.ALLOCATED:
        ev_h = d.get("evicted_hashes") or {}
        lost = f"; evicted cached hashes {', '.join(f'{b}:{h[:8]}' for b, h in ev_h.items())}" if ev_h else ""
        return f"{who}allocated blocks {ids}{grp} from the free-queue head{lost}"
    if k == events.EVICTED:
        return f"{who}block {ids[0]} lost hash {d.get('hash', '')[:8]} ({d.get('reason')})"
    if k == events.TOUCHED:
        fq = d.get("from_queue") or []
        where = f"; {fq} pulled out of the free queue at positions {d.get('queue_positions')}" if fq else ""
        return f"{who}touched {ids}{grp}: ref_cnt += 1{where}"
    if k == events.CACHED:
        return f"{who}cached full blocks {ids}{grp} as {', '.join(h[:8] for h in d.get('hashes', []))}"
    if k == events.FREED:
        return (f"{who}freed {ids}{grp} ({d.get('reason')}): to head {d.get('to_head')}, "
                f"to tail {d.get('to_tail')}, still used {d.get('still_used')}")
    if k == events.WINDOW_SKIPPED:
        return f"{who}sliding window passed blocks {ids}{grp}: table slots {d.get('slots')} -> null block"
    if k == events.SCHEDULED:
        return f"{who}scheduled {d.get('num_tokens')} tokens ({d.get('kind')}) from position {d.get('start')}"
    if k in (events.ADMITTED, events.RESUMED):
        return f"{who}{k}, starting with {d.get('num_cached_tokens')} cached tokens"
    if k == events.BLOCKED:
        return f"{who}not admitted: {d.get('reason')}"
    if k == events.PREEMPTED:
        return f"{who}PREEMPTED ({d.get('policy')}): {d.get('reason')}; its blocks are freed, it will recompute"
    if k == events.FINISHED:
        return f"{who}finished ({d.get('reason')})"
    if k == events.RESET:
        return f"prefix cache reset {'done' if d.get('ok') else 'refused: blocks in use'}"
    if k == events.SAMPLED:
        return f"sampled {d.get('tokens')}"
    return f"{who}{k} {ids} {d}"


def _log_step(rec: snapshot.StepRecord, out: TextIO) -> None:
    snap = rec.snapshot
    out.write(f"== step {rec.step}: batch {rec.scheduled} | free {snap.num_free_blocks} "
              f"| usage {snap.usage:.0%} | waiting {list(snap.waiting)} running {list(snap.running)}\n")
    for ev in rec.events:
        out.write(f"   {describe(ev)}\n")
    out.write(f"   free queue head->tail: {list(snap.free_queue)}\n")


def cmd_run(args: argparse.Namespace) -> int:
    try:
        scenario = load_scenario(args.scenario)
    except ScenarioError as e:
        print(f"error: {args.scenario}: {e}", file=sys.stderr)
        return 2
    if args.model:
        scenario = replace(scenario, model=args.model)
    if args.device:
        scenario = replace(scenario, device=args.device)
    if args.until and args.until not in events.EVENT_KINDS:
        print(f"error: --until must be one of {', '.join(events.EVENT_KINDS)}", file=sys.stderr)
        return 2
    from kvcore.engine import Engine
    from kvcore.model import ModelNotAvailable, DeviceNotAvailable
    try:
        engine = Engine(scenario, debug=args.check, progress=lambda m: print(m, file=sys.stderr))
    except (ModelNotAvailable, DeviceNotAvailable) as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    except ValueError as e:
        print(f"error: {args.scenario}: {e}", file=sys.stderr)
        return 2
    trace_file = open(args.trace, "w", encoding="utf-8") if args.trace else None
    try:
        if trace_file:  # the header: the scenario as run (after overrides) and the state before step 1
            trace_file.write(trace.header_line(scenario_to_dict(scenario), engine.snapshot()) + "\n")
        while engine.has_unfinished():
            try:
                rec = engine.step()
            except ValueError as e:  # a request that cannot be added (too long for the pool, bad ids)
                print(f"error: {args.scenario}: {e}", file=sys.stderr)
                return 2
            if not args.quiet:
                _log_step(rec, sys.stdout)
            if trace_file:
                trace_file.write(trace.step_line(rec) + "\n")
            if args.until and any(e.kind == args.until for e in rec.events):
                print(f"-- stopped at the first '{args.until}' event (step {rec.step})")
                break
        outputs = engine.outputs()
        if trace_file:
            trace_file.write(trace.outputs_line(outputs) + "\n")
        print("== outputs")
        for rid, o in outputs.items():
            print(f"   {rid}: {o['text']!r} {o['token_ids']}")
    finally:
        if trace_file:
            trace_file.close()
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvcore", description="Paged KV Lab engine")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="replay a scenario step by step")
    r.add_argument("scenario", help="scenario JSON file")
    r.add_argument("--trace", help="write a JSONL trace (header, one line per step, outputs) to this file; "
                                   "the app's Trace viewer opens it")
    r.add_argument("--until", help="stop at the first event of this kind")
    r.add_argument("--model", choices=MODELS, help="override the scenario's model")
    r.add_argument("--device", choices=DEVICES, help="override the scenario's device")
    r.add_argument("--check", action="store_true", help="check the block-manager invariants after every step")
    r.add_argument("--quiet", action="store_true", help="print only the outputs")
    args = p.parse_args(argv)
    return cmd_run(args)


if __name__ == "__main__":
    sys.exit(main())
