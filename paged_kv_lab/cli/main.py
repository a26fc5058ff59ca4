"""Command line: replay a scenario step by step.

    python -m kvcore run SCENARIO.json [--trace OUT.jsonl] [--html OUT.html] [--until EVENT]
                             [--model M] [--device D] [--set KEY=VALUE ...]
    python -m kvcore explain (SCENARIO.json | --trace OUT.jsonl)
                             (--request ID [--step N] [--vs ID] | --block N | --calls --step N)
                             [--lang zh]
    python -m kvcore profile [--model M] [--device D] [--block-size N] [--gpu-memory-utilization F]
                             [--max-num-batched-tokens N] [--max-model-len N]
    python -m kvcore replay TRACE.jsonl [--set KEY=VALUE ...] [--arrival sequential|timestamps]
                             [--speedup X] [--json [PATH]] [--sweep KEY=V1,V2,...] [--csv [PATH]]
    python -m kvcore compare TRACE.jsonl [--designs vllm,sglang,nano] [--set KEY=VALUE ...]
                             [--page-size N] [--json [PATH]] [--sweep num_gpu_blocks=V1,V2,...]
    python -m kvcore pack --out DIR [--lessons all|ID,ID,...] [--lang en,zh] [--model M]
    python -m kvcore fleet TRACE.jsonl [--replicas N] [--router POLICY] [--set KEY=VALUE ...]
                             [--arrival sequential|timestamps] [--json [PATH]]
                             [--sweep router=P1,P2,... | replicas=N1,N2,...]
    python -m kvcore serve-events [SCENARIO.json | TRACE.jsonl] [--replicas N] [--router POLICY]
                             [--endpoint tcp://127.0.0.1:5557] [--replay-endpoint ENDPOINT]
                             [--pace-ms MS]

Exit codes: 0 ok, 2 bad scenario or arguments, 3 model or device unavailable.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from dataclasses import replace
from typing import TextIO

from kvcore.model.shapes import TINY_MODELS
from paged_kv_lab.recording import events, snapshot
from paged_kv_lab.run import trace_file as trace
from paged_kv_lab.run.scenario import (
    DEVICES,
    DTYPES,
    MODELS,
    ScenarioError,
    block_size_note,
    load_scenario,
    parse_engine_overrides,
    scenario_to_dict,
    with_engine_overrides,
)
from paged_kv_lab.text.i18n import Text, languages, said, tr
from paged_kv_lab.why.sentences import kept_blocks, sentence, sizing_sentences


def _loading():
    """Around loading a model: kvcore/model prints its one-time messages ("converting the SmolLM2
    tokenizer once...") itself, so they go to stderr, once; a progress callback that printed them
    as well showed each twice."""
    return contextlib.redirect_stdout(sys.stderr)


def _error(args: argparse.Namespace, message) -> str:
    """A message for stderr, in the command's language (``message``: a Text or plain text)."""
    return tr("cli.error", getattr(args, "lang", "en"), message=message)


def describe(
    ev: events.Event,
    lang: str = "en",
    decode=None,
    multi_group: bool = False,
    kept: frozenset[str] = frozenset(),
) -> str:
    """One log line per event: the app's sentence for it (text.sentences), reason included."""
    return sentence(ev, lang, decode, multi_group, kept)


def _log_step(rec: snapshot.StepRecord, out: TextIO, lang: str = "en", decode=None) -> None:
    snap = rec.snapshot
    head = dict(step=rec.step, batch=rec.scheduled, free=snap.num_free_blocks, usage=snap.usage)
    head.update(waiting=list(snap.waiting), running=list(snap.running))
    out.write(tr("cli.log.step", lang, **head) + "\n")
    multi_group = len(snap.groups) > 1
    kept = kept_blocks(snap)
    for ev in rec.events:
        out.write(f"   {describe(ev, lang, decode, multi_group, kept)}\n")
    out.write("   " + tr("cli.log.free_queue", lang, ids=list(snap.free_queue)) + "\n")


def _log_replica(rec: snapshot.StepRecord, out: TextIO, lang: str, decode=None) -> None:
    """A P/D pair's step: which replica it is, its log, and the K/V its connector pulled."""
    out.write(tr("pd.cli.replica", lang, replica=Text(f"pd.replica.{rec.replica}")) + "\n")
    _log_step(rec, out, lang, decode)
    for rid, (remote, local) in rec.pulls.items():
        out.write("   " + tr("pd.cli.pull", lang, rid=rid, remote=list(remote), local=list(local)))
        out.write("\n")


def _write_html(path: str, scenario, initial, records, engine, lang: str, done: bool) -> None:
    """The run as one self-contained HTML file: the app's step player with every step inlined."""
    from paged_kv_lab.player import (
        run_payload,
        static_html,
    )  # lazy: the player is not needed for a plain run

    decode = engine.decode if engine.model is not None else None
    payload = run_payload(
        initial,
        records,
        done=done,
        lang=lang,
        decode=decode,
        request_ids=[r.id for r in scenario.requests],
    )
    with open(path, "w", encoding="utf-8") as f:
        f.write(static_html(payload, title=tr("trace.export_title", lang, name=scenario.name)))


def open_engine(args: argparse.Namespace, scenario, kv_events):
    """The model loaded and the engine built for ``scenario`` (a P/D pair for ``kv_transfer:
    "pd"``), after the budget checks (``num_gpu_blocks: "auto"`` derived as vLLM does, its
    sizing printed): ``(scenario as run, engine)``, or the exit code once the reason is
    printed. ``kv_events``: the engine's KV-event settings (None: none published)."""
    import zmq

    from kvcore.model import DeviceNotAvailable, ModelNotAvailable
    from paged_kv_lab.run.engine import Engine

    try:
        from kvcore.model import load_model
        from paged_kv_lab.run.budget import check_scenario, cli_limits, prompt_encoder

        limits = cli_limits()
        auto = scenario.engine.num_gpu_blocks == "auto"
        # the shape of the run, before anything is loaded ("auto" is checked once derived)
        check_scenario(
            replace(scenario, engine=replace(scenario.engine, num_gpu_blocks=2))
            if auto
            else scenario,
            limits,
        )
        with _loading():
            model = load_model(scenario.model, scenario.device, scenario.dtype)
        if auto:  # profile the model, derive the pool as vLLM does; the trace records the number
            from paged_kv_lab.run.engine import size_kv_cache, sized_settings

            sizing = size_kv_cache(model, scenario.engine)
            print("\n".join(sizing.lines()))
            for line in sizing_sentences(sizing):
                print(tr(line, getattr(args, "lang", "en")))
            scenario = replace(scenario, engine=sized_settings(scenario.engine, sizing))
        check_scenario(scenario, limits, model.config, prompt_encoder(model))
        if scenario.engine.kv_transfer == "pd":  # a prefill replica and a decode replica
            from paged_kv_lab.disagg.pd import PDEngine, PDRun
            from paged_kv_lab.run.engine import EngineRefused

            if kv_events is not None:
                raise EngineRefused("engine.pd_no_kv_events")

            return scenario, PDRun(PDEngine(scenario, model=model, debug=args.check))
        return scenario, Engine(scenario, model=model, debug=args.check, kv_events=kv_events)
    except (ModelNotAvailable, DeviceNotAvailable) as e:
        print(_error(args, f"{e}"), file=sys.stderr)
        return 3
    except zmq.ZMQError as e:
        print(_error(args, f"--kv-events: {e}"), file=sys.stderr)
        return 2
    except ValueError as e:
        print(_error(args, f"{args.scenario}: {said(e, args.lang)}"), file=sys.stderr)
        return 2


def _model_device(args: argparse.Namespace) -> dict:
    """``--model`` / ``--device`` as the top-level fields they replace; they replace the file's
    before anything is resolved from the model (a hybrid model's block size)."""
    return {k: v for k, v in (("model", args.model), ("device", args.device)) if v}


def cmd_run(args: argparse.Namespace) -> int:
    try:
        scenario = load_scenario(args.scenario, _model_device(args))
        if getattr(args, "set", None):
            scenario = with_engine_overrides(scenario, parse_engine_overrides(args.set))
        if getattr(args, "cpu_offload_blocks", None) is not None or getattr(args, "lazy", False):
            # the CPU tier (engine.cpu_offload), as vLLM's kv_connector_extra_config sets it
            tier = dict(scenario_to_dict(scenario)["engine"].get("cpu_offload") or {})
            if args.cpu_offload_blocks is not None:
                tier["num_cpu_blocks"] = args.cpu_offload_blocks
            if args.lazy:
                tier["lazy_offload"] = True
            scenario = with_engine_overrides(scenario, {"cpu_offload": tier})
    except ScenarioError as e:
        print(_error(args, f"{args.scenario}: {said(e, args.lang)}"), file=sys.stderr)
        return 2
    if args.until and args.until not in events.EVENT_KINDS:
        kinds = ", ".join(k.value for k in events.EVENT_KINDS)
        print(_error(args, Text("cli.error.until", {"kinds": kinds})), file=sys.stderr)
        return 2
    from kvcore.config.kv_events import KVEventsConfig

    kv_events = scenario.engine.kv_events  # the file's engine.kv_events, unless --kv-events
    try:
        if getattr(args, "kv_events", None):
            kv_events = KVEventsConfig(
                enable_kv_cache_events=True,
                endpoint=args.kv_events,
                replay_endpoint=args.kv_events_replay,
                topic=args.kv_events_topic,
            )
    except ValueError as e:
        print(_error(args, f"{args.scenario}: {said(e, args.lang)}"), file=sys.stderr)
        return 2
    note = block_size_note(scenario)
    if note is not None:  # a hybrid model: the block size as vLLM resolves it
        print(tr(note, args.lang))
    opened = open_engine(args, scenario, kv_events)
    if isinstance(opened, int):
        return opened
    scenario, engine = opened
    trace_file = open(args.trace, "w", encoding="utf-8") if args.trace else None
    initial, records = (engine.snapshot(), []) if getattr(args, "html", None) else (None, None)
    try:
        # the header: the scenario as run (after overrides) and the state before step 1
        if trace_file:
            trace_file.write(
                trace.header_line(scenario_to_dict(scenario), engine.snapshot()) + "\n"
            )
        # one driver (run/driver.py): a plain engine, or a P/D pair whose records name their replica
        while engine.has_unfinished():
            try:
                rec = engine.step()
            # a request that cannot be added (too long for the pool, bad ids)
            except ValueError as e:
                print(_error(args, f"{args.scenario}: {e}"), file=sys.stderr)
                return 2
            if not args.quiet:
                decode = engine.decode if engine.model is not None else None
                if rec.replica is not None:
                    _log_replica(rec, sys.stdout, args.lang, decode)
                else:
                    _log_step(rec, sys.stdout, args.lang, decode)
            if trace_file:
                trace_file.write(trace.step_line(rec) + "\n")
            if records is not None:
                records.append(rec)
            if args.until and any(e.kind == args.until for e in rec.events):
                print(tr("cli.log.stopped", args.lang, kind=args.until, step=rec.step))
                break
        outputs = engine.outputs()
        if trace_file:
            trace_file.write(trace.outputs_line(outputs, engine.parents()) + "\n")
        if records is not None:
            _write_html(
                args.html,
                scenario,
                initial,
                records,
                engine,
                args.lang,
                done=not engine.has_unfinished(),
            )
        print(tr("cli.log.outputs", args.lang))
        for rid, o in outputs.items():
            print(f"   {rid}: {o['text']!r} {o['token_ids']}")
        for pid, kids in engine.parents().items():
            print(
                "   " + tr("cli.log.parent", args.lang, pid=pid, n=len(kids), kids=", ".join(kids))
            )
    finally:
        if trace_file:
            trace_file.close()
        engine.close()  # sends the queued KV events first
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvcore", description=tr("cli.description"))
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help=tr("cli.run.help"))
    r.add_argument("scenario", help=tr("cli.run.scenario"))
    r.add_argument(
        "--trace",
        help=tr("cli.run.trace"),
    )
    r.add_argument(
        "--html",
        metavar="OUT.html",
        help=tr("cli.run.html"),
    )
    r.add_argument("--until", help=tr("cli.run.until"))
    r.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        default=[],
        help=tr("cli.run.set"),
    )
    r.add_argument(
        "--cpu-offload-blocks",
        type=int,
        metavar="N",
        help=tr("cli.run.cpu_offload_blocks"),
    )
    r.add_argument(
        "--lazy-offload",
        dest="lazy",
        action="store_true",
        help=tr("cli.run.lazy"),
    )
    r.add_argument("--model", choices=MODELS, help=tr("cli.run.model"))
    r.add_argument("--device", choices=DEVICES, help=tr("cli.run.device"))
    r.add_argument("--check", action="store_true", help=tr("cli.run.check"))
    r.add_argument("--quiet", action="store_true", help=tr("cli.run.quiet"))
    r.add_argument(
        "--lang",
        choices=tuple(languages()),
        default="en",
        help=tr("cli.run.lang"),
    )
    r.add_argument(
        "--kv-events",
        metavar="ENDPOINT",
        help=tr("cli.run.kv_events"),
    )
    r.add_argument("--kv-events-replay", metavar="ENDPOINT", help=tr("cli.run.kv_events_replay"))
    r.add_argument("--kv-events-topic", default="", help=tr("cli.run.kv_events_topic"))
    w = sub.add_parser("watch", help=tr("cli.watch.help"))
    w.add_argument("endpoint", help=tr("cli.watch.endpoint"))
    w.add_argument("--replay", help=tr("cli.watch.replay"))
    w.add_argument("--topic", default="", help=tr("cli.watch.topic"))
    w.add_argument(
        "--bind",
        action="store_true",
        help=tr("cli.watch.bind"),
    )
    w.add_argument(
        "--data-parallel-size",
        type=int,
        default=1,
        help=tr("cli.watch.data_parallel_size"),
    )
    w.add_argument("--model", choices=MODELS, help=tr("cli.watch.model"))
    w.add_argument("--duration", type=float, help=tr("cli.watch.duration"))
    w.add_argument(
        "--dump-state",
        metavar="OUT.json",
        help=tr("cli.watch.dump_state"),
    )
    x = sub.add_parser("explain", help=tr("cli.explain.help"))
    x.add_argument("scenario", nargs="?", help=tr("cli.explain.scenario"))
    x.add_argument("--trace", metavar="OUT.jsonl", help=tr("cli.explain.trace"))
    x.add_argument("--request", metavar="ID", help=tr("cli.explain.request"))
    x.add_argument(
        "--step",
        type=int,
        help=tr("cli.explain.step"),
    )
    x.add_argument("--vs", metavar="ID", help=tr("cli.explain.vs"))
    x.add_argument("--block", type=int, metavar="N", help=tr("cli.explain.block"))
    x.add_argument("--calls", action="store_true", help=tr("cli.explain.calls"))
    x.add_argument(
        "--set", action="append", metavar="KEY=VALUE", default=[], help=tr("cli.explain.set")
    )
    x.add_argument(
        "--model",
        choices=MODELS,
        help=tr("cli.explain.model"),
    )
    x.add_argument("--device", choices=DEVICES, help=tr("cli.explain.device"))
    x.add_argument(
        "--lang",
        choices=tuple(languages()),
        default="en",
        help=tr("cli.explain.lang"),
    )
    f = sub.add_parser("profile", help=tr("cli.profile.help"))
    f.add_argument("--model", choices=MODELS, default="smollm2", help=tr("cli.profile.model"))
    f.add_argument("--device", choices=DEVICES, default="auto", help=tr("cli.profile.device"))
    f.add_argument("--dtype", choices=DTYPES, default="float32", help=tr("cli.profile.dtype"))
    f.add_argument("--block-size", type=int, default=None, help=tr("cli.profile.block_size"))
    f.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=None,
        help=tr("cli.profile.gpu_memory_utilization"),
    )
    f.add_argument(
        "--enable-extensible-kv-cache",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=tr("cli.profile.enable_extensible_kv_cache"),
    )
    f.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=256,
        help=tr("cli.profile.max_num_batched_tokens"),
    )
    f.add_argument("--max-model-len", type=int, help=tr("cli.profile.max_model_len"))
    mdl = sub.add_parser("model", help=tr("cli.model.help"))
    mdl_sub = mdl.add_subparsers(dest="model_cmd", required=True)
    save = mdl_sub.add_parser("save", help=tr("cli.model.save.help"))
    save.add_argument("name", choices=TINY_MODELS, help=tr("cli.model.name"))
    save.add_argument("folder", help=tr("cli.model.folder"))
    from paged_kv_lab.cli.replay_command import add_parser as add_replay_parser

    add_replay_parser(sub)
    from paged_kv_lab.cli.compare_command import add_parser as add_compare_parser

    add_compare_parser(sub)
    from paged_kv_lab.cli.pack_command import add_parser as add_pack_parser

    add_pack_parser(sub)
    from paged_kv_lab.cli.fleet_command import add_parser as add_fleet_parser
    from paged_kv_lab.cli.fleet_command import add_serve_parser

    add_fleet_parser(sub)
    add_serve_parser(sub)
    args = p.parse_args(argv)
    if args.cmd == "pack":
        from paged_kv_lab.cli.pack_command import cmd_pack

        return cmd_pack(args)
    if args.cmd == "replay":
        from paged_kv_lab.cli.replay_command import cmd_replay

        return cmd_replay(args)
    if args.cmd == "compare":
        from paged_kv_lab.cli.compare_command import cmd_compare

        return cmd_compare(args)
    if args.cmd == "fleet":
        from paged_kv_lab.cli.fleet_command import cmd_fleet

        return cmd_fleet(args)
    if args.cmd == "serve-events":
        from paged_kv_lab.cli.fleet_command import cmd_serve_events

        return cmd_serve_events(args)
    if args.cmd == "explain":
        return cmd_explain(args)
    if args.cmd == "watch":
        return cmd_watch(args)
    if args.cmd == "profile":
        return cmd_profile(args)
    if args.cmd == "model":
        from kvcore.model.loader import save_model

        save_model(args.name, args.folder)
        return 0
    return cmd_run(args)


def cmd_profile(args: argparse.Namespace) -> int:
    """Print the memory profile of the loaded model and the num_gpu_blocks it gives."""
    from kvcore.model import DeviceNotAvailable, ModelNotAvailable, load_model
    from kvcore.model.memory import DEFAULT_BLOCK_SIZE, num_gpu_blocks_from_profile
    from kvcore.model.profile import profile_model
    from paged_kv_lab.run.scenario import model_page_sizes

    if args.block_size is None:  # a hybrid model's as vLLM resolves it, as a scenario's
        sizes = model_page_sizes(args.model, args.dtype)
        args.block_size = DEFAULT_BLOCK_SIZE if sizes is None else sizes.block_size
    for name, value, lo in (
        ("--block-size", args.block_size, 1),
        ("--max-num-batched-tokens", args.max_num_batched_tokens, 1),
        ("--max-model-len", args.max_model_len or 1, 1),
    ):
        if value < lo:
            too_small = Text("cli.error.too_small", {"name": name, "lo": lo, "value": value})
            print(_error(args, too_small), file=sys.stderr)
            return 2
    if args.gpu_memory_utilization is not None and not 0 < args.gpu_memory_utilization <= 1:
        bad = Text("cli.error.gpu_memory_utilization", {"value": args.gpu_memory_utilization})
        print(_error(args, bad), file=sys.stderr)
        return 2
    try:
        with _loading():
            model = load_model(args.model, args.device, args.dtype)
    except (ModelNotAvailable, DeviceNotAvailable) as e:
        print(_error(args, f"{e}"), file=sys.stderr)
        return 3
    max_model_len = args.max_model_len or getattr(model.config, "max_position_embeddings", 8192)
    try:
        profile = profile_model(model, args.max_num_batched_tokens, args.block_size)
        sizing = num_gpu_blocks_from_profile(
            profile,
            model.config,
            args.block_size,
            model.dtype,
            args.gpu_memory_utilization,
            max_model_len,
            enable_extensible_kv_cache=args.enable_extensible_kv_cache,
        )
    except ValueError as e:  # e.g. a VLLM_CPU_KVCACHE_SPACE that is not a number
        print(_error(args, f"{e}"), file=sys.stderr)
        return 2
    print("\n".join(sizing.lines()))
    for line in sizing_sentences(sizing):
        print(tr(line, getattr(args, "lang", "en")))
    return 0


def cmd_watch(args: argparse.Namespace) -> int:
    """Print a line per KV-event batch; keep --dump-state current; stop on SIGINT/SIGTERM or
    --duration."""
    import signal
    import threading
    import time

    from paged_kv_lab.watch.watcher import KVEventWatcher, describe_batch, write_json_atomic

    decode = None
    if args.model:
        from kvcore.model import DeviceNotAvailable, ModelNotAvailable, load_model

        try:
            with _loading():
                model = load_model(args.model, "cpu", "float32")
        except (ModelNotAvailable, DeviceNotAvailable) as e:
            print(_error(args, f"{e}"), file=sys.stderr)
            return 3
        decode = model.decode

    def dump() -> None:
        if args.dump_state:
            write_json_atomic(args.dump_state, watcher.snapshot().dump())

    dirty = threading.Event()

    def on_batch(rank, seq, batch, replayed) -> None:
        print(describe_batch(rank, seq, batch, replayed, decode), flush=True)
        dirty.set()  # the main loop writes the state (at most 5 times a second: it can be large)

    try:
        watcher = KVEventWatcher(
            args.endpoint,
            args.replay,
            args.topic,
            args.bind,
            args.data_parallel_size,
            on_batch=on_batch,
        )
    except ValueError as e:
        print(_error(args, f"{e}"), file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    deadline = None if args.duration is None else time.monotonic() + args.duration
    watcher.start()
    while not watcher.connected.wait(0.05):
        if not watcher.running or stop.is_set():
            break
    if watcher.connected.is_set():
        dump()
        print(
            f"watching {', '.join(r.endpoint for r in watcher.ranks)}"
            f"{' replay ' + args.replay if args.replay else ''}",
            file=sys.stderr,
            flush=True,
        )
    while (
        not stop.is_set() and watcher.running and (deadline is None or time.monotonic() < deadline)
    ):
        stop.wait(0.2)
        if dirty.is_set():
            dirty.clear()
            dump()
    watcher.stop()
    snap = watcher.snapshot()
    dump()
    st = snap.stats
    print(
        f"-- {st.batches} batches ({st.replayed_batches} replayed), "
        f"{st.gaps} gaps, {st.lost_batches} lost, {st.restarts} restarts, "
        f"{st.garbage_messages + st.oversized_messages} skipped",
        file=sys.stderr,
    )
    if snap.error:
        print(_error(args, f"{snap.error}"), file=sys.stderr)
        return 1
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    """Record the scenario's run (or read the trace), then print the answer (why.explain_text)."""
    from kvcore.model import DeviceNotAvailable, ModelNotAvailable, load_model
    from paged_kv_lab.why.explain import ExplainError, RecordedSteps
    from paged_kv_lab.why.explain_text import answer

    if (args.scenario is None) == (args.trace is None):
        print(_error(args, Text("cli.error.scenario_or_trace")), file=sys.stderr)
        return 2
    try:
        if args.trace:
            with open(args.trace, "rb") as fh:
                recorded = trace.read_trace(fh.read())
            decode = None
            if args.model:
                with _loading():
                    decode = load_model(args.model, "cpu", "float32").decode
            run = RecordedSteps.from_trace(recorded, decode)
        else:
            scenario = load_scenario(args.scenario, _model_device(args))
            if args.set:
                scenario = with_engine_overrides(scenario, parse_engine_overrides(args.set))
            from paged_kv_lab.run.budget import check_scenario, cli_limits
            from paged_kv_lab.run.engine import Engine

            auto = scenario.engine.num_gpu_blocks == "auto"
            check_scenario(
                replace(scenario, engine=replace(scenario.engine, num_gpu_blocks=2))
                if auto
                else scenario,
                cli_limits(),
            )
            with _loading():
                engine = Engine(scenario)
            initial = engine.snapshot()
            records = engine.run()
            run = RecordedSteps(initial, tuple(records), engine.settings, engine.decode)
        lines = answer(
            run,
            request=args.request,
            step=args.step,
            vs=args.vs,
            block=args.block,
            calls=args.calls,
            lang=args.lang,
        )
    except (ModelNotAvailable, DeviceNotAvailable) as e:
        print(_error(args, f"{e}"), file=sys.stderr)
        return 3
    except OSError as e:
        print(_error(args, f"{args.trace}: {e.strerror or e}"), file=sys.stderr)
        return 2
    # ScenarioError, TraceError, BudgetError are ValueErrors
    except (ExplainError, ValueError) as e:
        why = said(e, args.lang)
        print(_error(args, f"{args.trace or args.scenario}: {why}"), file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
