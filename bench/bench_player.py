"""The step player, measured in a real browser and under a class of websocket clients.

    python bench/bench_player.py [--model smollm2|tiny-random] [--clicks 60] [--sessions 30]
                                 [--skip-browser] [--skip-class]

A real server (streamlit run app.py on 127.0.0.1, an OS-chosen port) and Debian's chromium
through Playwright:
- first picture: a lesson opened (model already loaded) until the player has drawn, on the page's
  own clock (``data-first-draw``), three ways: a click on the lesson in the open app's sidebar, a
  new tab of the same browser (cache warm) and a new browser profile (nothing cached);
- recorded step: Step / Back / timeline clicks on recorded steps, click -> painted (the click is
  dispatched in the page, painted = two animation frames after it; no server round-trip);
- Step at the frontier: on a fresh playground run, Step when the next step is not recorded yet;
- server CPU: the server process's CPU seconds over 100 recorded-step clicks (a click every
  120 ms, then 2 s for the debounced cursor reports).
A class: N websocket clients (the browser's own protocol: BackMsg / ForwardMsg protobufs on
/_stcore/stream, no browser), each opening a lesson and then reporting 10 cursor moves the way
player.js does (the component's state as a widget value with the count of steps held, one fragment
rerun each; the client first asks for the run's steps until it is recorded, as player.js does);
the time from a report to the server's script_finished, p50 / p90, errors, and each session's
own run token.
Prints markdown; the load average is printed with it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
FIND_ROOT = (
    "() => [...document.querySelectorAll('*')].map(e => e.shadowRoot)"
    ".find(r => r && r.querySelector('.pkv'))"
)


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str):
    port = free_port()
    env = {**os.environ, "PAGED_KV_LAB_MODEL": model, "PAGED_KV_LAB_DEVICE": "cpu"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streamlit",
            "run",
            "app.py",
            "--server.headless",
            "true",
            "--server.address",
            "127.0.0.1",
            "--server.port",
            str(port),
            "--browser.gatherUsageStats",
            "false",
            "--server.fileWatcherType",
            "none",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url + "/_stcore/health", timeout=2) as r:
                if r.read().strip() == b"ok":
                    return proc, url
        except OSError:
            time.sleep(0.3)
    stop(proc)
    raise SystemExit("the server did not start")


def stop(proc) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def rss_mb(pid: int) -> float:
    import psutil

    return psutil.Process(pid).memory_info().rss / 1e6


def cpu_seconds(pid: int) -> float:
    import psutil

    p = psutil.Process(pid)
    t = p.cpu_times()
    return t.user + t.system


# -- the browser -----------------------------------------------------------------------------
CLICK = (
    """async ([act]) => {
  const root = (%s)();
  const box = root.querySelector('.pkv');
  const before = box.dataset.step;
  const t0 = performance.now();
  if (act === 'timeline') {
    const tl = root.querySelector('.pkv-timeline');
    tl.value = String(Math.floor(Math.random() * Number(tl.max)));
    tl.dispatchEvent(new Event('input'));
  } else {
    root.querySelector(`[data-act="${act}"]`).click();
  }
  await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
  return [performance.now() - t0, before, box.dataset.step];
}"""
    % FIND_ROOT
)


def wait_done(page, timeout=300_000):
    page.wait_for_selector('.pkv[data-done="true"]', timeout=timeout)


def bench_browser(url: str, server_pid: int, clicks: int) -> dict:
    from playwright.sync_api import sync_playwright

    out: dict = {}
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = b.new_page(viewport={"width": 1500, "height": 1900})
        page.on("pageerror", lambda e: print(f"| page error: {str(e)[:800]} |", flush=True))
        page.on(
            "response",
            lambda r: r.status >= 400 and print(f"| HTTP {r.status}: {r.url[:200]} |", flush=True),
        )
        page.goto(url)  # loads the model (not timed)
        page.wait_for_selector(".pkv[data-total]", timeout=600_000)
        wait_done(page)
        page.goto(url + "/eviction")
        page.wait_for_selector(".pkv[data-total]", timeout=120_000)
        wait_done(page)
        n = int(page.locator(".pkv").get_attribute("data-total"))
        times = {"step": [], "back": [], "timeline": []}
        page.evaluate("([a]) => 0", ["x"])
        for i in range(clicks):
            act = ("step", "back", "timeline")[i % 3]
            if act == "step" and int(page.locator(".pkv").get_attribute("data-step")) >= n:
                page.evaluate("(f) => (%s)().querySelector('[data-act=home]').click()" % FIND_ROOT)
            ms, before, after = page.evaluate(CLICK, [act])
            times[act].append(ms)
            page.wait_for_timeout(60)
        out["recorded click -> painted (ms)"] = times
        for act, xs in times.items():
            print(
                f"| recorded {act} click -> painted (ms) | {pct(xs, 0.5):.1f} | "
                f"{pct(xs, 0.9):.1f} | {len(xs)} |",
                flush=True,
            )
        # server CPU over 100 recorded-step clicks
        page.evaluate("(f) => (%s)().querySelector('[data-act=home]').click()" % FIND_ROOT)
        page.wait_for_timeout(1500)
        c0 = cpu_seconds(server_pid)
        for i in range(100):
            act = "step" if (i // n) % 2 == 0 else "back"
            page.evaluate(CLICK, [act])
            page.wait_for_timeout(120)
        page.wait_for_timeout(2000)
        out["server CPU over 100 clicks (s)"] = cpu_seconds(server_pid) - c0
        print(
            "server CPU over 100 recorded-step clicks: "
            f"{out['server CPU over 100 clicks (s)']:.2f} s",
            flush=True,
        )
        out["first picture"] = first_pictures(b, page, url)
        # Step at the frontier: a playground run no one has recorded (a unique prompt)
        from paged_kv_lab.ui.state import _encode_base

        scn = {
            "name": "frontier",
            "engine": {"block_size": 8, "num_gpu_blocks": 64},
            "requests": [
                {
                    "id": "A",
                    "prompt": f"Tell a long story about the number {time.time()}",
                    "max_tokens": 60,
                }
            ],
        }
        page.goto(f"{url}/playground?lesson=playground&scn={_encode_base(scn)}")
        page.wait_for_selector(".pkv[data-total]", timeout=120_000)
        frontier = []
        for _ in range(12):
            if page.locator(".pkv").get_attribute("data-done") == "true":
                break
            page.evaluate("(f) => (%s)().querySelector('[data-act=home]').click()" % FIND_ROOT)
            page.keyboard.press("End")
            cur = int(page.locator(".pkv").get_attribute("data-step"))
            t0 = time.perf_counter()
            page.evaluate("(f) => (%s)().querySelector('[data-act=step]').click()" % FIND_ROOT)
            try:
                page.wait_for_function(
                    f"() => Number((%s)().querySelector('.pkv').dataset.step) > {cur}" % FIND_ROOT,
                    timeout=60_000,
                )
            except Exception:  # reported, not raised: the rest of the bench still runs
                print("| Step at the frontier: no step within 60 s |", flush=True)
                break
            frontier.append(1000 * (time.perf_counter() - t0))
        out["Step at the frontier (ms)"] = frontier
        b.close()
    return out


LESSON_PATHS = ("blocks", "prefix_caching", "eviction", "preemption", "sliding_window")
FIRST_DRAW = (
    """() => { const r = (%s)(); const b = r && r.querySelector('.pkv');
  return b && b.querySelector('.pkv-grid .pkv-block') ? Number(b.dataset.firstDraw) : null; }"""
    % FIND_ROOT
)


def first_pictures(browser, page, url: str) -> dict:
    """A lesson's first picture (the player's first draw), model loaded, three ways a learner gets
    there: clicking the lesson in the sidebar of the open app (the usual way: no page load), a new
    tab of the same browser (its cache warm), and a new browser profile (a first visit: nothing
    cached). Each measurement starts with the server idle (the lesson before it recorded to its
    end): server and browser share this machine's two cores, which a class's laptops would not."""
    out = {"sidebar click": [], "new tab, warm cache": [], "new profile, cold cache": []}
    page.goto(url)
    page.wait_for_selector(".pkv-grid .pkv-block", timeout=120_000)
    for path in LESSON_PATHS:
        page.wait_for_timeout(500)
        t = page.evaluate("() => performance.now()")
        page.locator(f'[data-testid=stSidebarNav] a[href$="/{path}"]').first.click()
        try:
            page.wait_for_function(
                f"() => {{ const d = ({FIRST_DRAW})(); return d !== null && d > {t}; }}",
                timeout=120_000,
            )
            out["sidebar click"].append((page.evaluate(FIRST_DRAW) - t) / 1000)
            wait_done(
                page
            )  # the server idle again: its engine shares these 2 cores with the browser
        except Exception:  # reported, not raised
            page.screenshot(path=f"/tmp/first-{path}.png")
            print(
                f"| sidebar click to /{path}: nothing drawn within 120 s (at {page.url}) |",
                flush=True,
            )
    ctx = browser.new_context(viewport={"width": 1500, "height": 1900})
    warm = ctx.new_page()
    warm.goto(url)
    warm.wait_for_selector(".pkv-grid .pkv-block", timeout=120_000)
    for kind in ("new tab, warm cache", "new profile, cold cache"):
        for path in LESSON_PATHS:
            p2 = (
                ctx.new_page()
                if kind.startswith("new tab")
                else browser.new_page(viewport={"width": 1500, "height": 1900})
            )
            p2.goto(f"{url}/{path}")
            try:
                p2.wait_for_selector(".pkv-grid .pkv-block", timeout=120_000)
                out[kind].append(
                    p2.evaluate(FIRST_DRAW) / 1000
                )  # navigation start -> the player's first draw
                wait_done(p2)
            except Exception:  # reported, not raised
                print(f"| {kind} /{path}: nothing drawn within 120 s |", flush=True)
            p2.close()
    ctx.close()
    for kind, xs in out.items():
        if xs:
            print(
                f"| a lesson's first picture, model loaded, {kind} (s) | {pct(xs, 0.5):.2f} | "
                f"{max(xs):.2f} | "
                f"{len(xs)} |",
                flush=True,
            )
    return out


# -- what is sent ------------------------------------------------------------------------------
def payload_sizes(model_name: str) -> list[tuple]:
    """Per lesson: KiB of whole snapshots per step vs the deltas the player is sent (JSON)."""
    from kvcore.model import load_model
    from paged_kv_lab.content import LESSONS
    from paged_kv_lab.player import RunEncoder, snapshot_dict
    from paged_kv_lab.run.engine import Engine
    from paged_kv_lab.store.timeline import lesson_scenario

    model = load_model(model_name, "cpu")
    rows = []
    for lesson in LESSONS:
        engine = Engine(
            lesson_scenario(lesson, model.num_layers, model=model.name, device="cpu"), model=model
        )
        initial = engine.snapshot()
        records = engine.run(max_steps=400)
        enc = RunEncoder(initial, decode=model.decode)
        steps = enc.extend(records)
        whole = sum(len(json.dumps(snapshot_dict(r.snapshot))) for r in records)
        sent = len(json.dumps(enc.head)) + sum(len(json.dumps(st)) for st in steps)
        rows.append(
            (lesson.id, len(records), whole / 1024, sent / 1024, sent / max(1, len(steps)) / 1024)
        )
    return rows


# -- a class of websocket clients -------------------------------------------------------------
async def one_session(
    url: str,
    page_name: str,
    moves: int,
    results: list,
    errors: list,
    tokens: list,
    query: str = "",
    recorded: list | None = None,
) -> None:
    import websockets
    from streamlit.proto.BackMsg_pb2 import BackMsg
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

    ws_url = url.replace("http://", "ws://") + "/_stcore/stream"

    async def rerun(ws, widget_states=None, fragment_id=None):
        msg = BackMsg()
        cs = msg.rerun_script
        cs.query_string = query
        cs.page_name = page_name
        if widget_states is not None:
            cs.widget_states.CopyFrom(widget_states)
        if fragment_id:
            cs.fragment_id = fragment_id
        t0 = time.perf_counter()
        await ws.send(msg.SerializeToString())
        found = None
        while True:
            raw = await asyncio.wait_for(ws.recv(), timeout=30)
            fm = ForwardMsg()
            fm.ParseFromString(raw)
            kind = fm.WhichOneof("type")
            if kind == "delta" and fm.delta.WhichOneof("type") == "new_element":
                el = fm.delta.new_element
                if el.WhichOneof("type") == "bidi_component" and el.bidi_component.id.endswith(
                    "pkv:" + key
                ):
                    found = (
                        el.bidi_component.id,
                        json.loads(el.bidi_component.json),
                        fm.delta.fragment_id,
                    )
            if kind == "script_finished":
                return time.perf_counter() - t0, found

    key = {
        "blocks": "blocks",
        "prefix_caching": "prefix",
        "eviction": "eviction",
        "playground": "playground",
    }[page_name]
    try:
        async with websockets.connect(ws_url, subprotocols=["streamlit"], max_size=None) as ws:
            opened = time.perf_counter()
            _, found = await rerun(ws)
            for _ in range(20):  # until the player is on the page
                if found:
                    break
                await asyncio.sleep(0.2)
                _, found = await rerun(ws)
            if not found:
                errors.append("no player on the page")
                return
            wid, data, fragment_id = found
            from streamlit.proto.WidgetStates_pb2 import WidgetStates

            asks = 0
            while (
                not data["done"] and len(data["steps"]) < 400
            ):  # the run streams in, as player.js asks for it
                await asyncio.sleep(0.5)
                asks += 1
                ws_state = WidgetStates()
                w = ws_state.widgets.add()
                w.id = wid
                w.json_value = json.dumps(
                    {"poll": {"run": data["run"], "n": len(data["steps"]), "ask": asks}}
                )
                _, found = await rerun(ws, ws_state, fragment_id)
                if found:
                    wid, more, fragment_id = found
                    data = {**more, "steps": data["steps"][: more["base"]] + more["steps"]}
            tokens.append(data["run"])
            if recorded is not None:
                recorded.append(time.perf_counter() - opened)
            for k in range(1, moves + 1):
                ws_state = WidgetStates()
                w = ws_state.widgets.add()
                w.id = wid
                w.json_value = json.dumps(
                    {"cursor": {"run": data["run"], "step": k % 6, "n": len(data["steps"])}}
                )
                dt, again = await rerun(ws, ws_state, fragment_id)
                # a full rerun (the run's end) mounts the fragment anew: the browser follows its id
                if again:
                    wid, fragment_id = again[0], again[2]
                results.append(dt)
                await asyncio.sleep(0.3)
    except Exception as e:  # counted, not raised: the bench reports errors
        errors.append(f"{type(e).__name__}: {e}")


def playground_query(i: int) -> str:
    """A playground link of its own for session ``i``: two requests, a prompt no other session "
    "has."""
    from paged_kv_lab.ui.state import _encode_base

    scn = {
        "name": f"class-{i}",
        "engine": {"block_size": 8, "num_gpu_blocks": 64, "max_num_seqs": 2},
        "requests": [
            {"id": "A", "prompt": f"Student {i} asks about paged attention", "max_tokens": 16},
            {
                "id": "B",
                "prompt": f"Student {i} asks about prefix caching",
                "max_tokens": 16,
                "arrival_step": 2,
            },
        ],
    }
    return f"lesson=playground&scn={_encode_base(scn)}"


async def bench_class(url: str, sessions: int, moves: int, playground: bool = False) -> dict:
    """``playground``: every session opens a scenario of its own (30 runs recorded), else one of
    three lessons (three shared runs)."""
    results, errors, tokens, recorded = [], [], [], []
    pages = ("blocks", "prefix_caching", "eviction")
    t0 = time.perf_counter()
    await asyncio.gather(
        *(
            one_session(
                url,
                "playground" if playground else pages[i % 3],
                moves,
                results,
                errors,
                tokens,
                query=playground_query(i) if playground else "",
                recorded=recorded,
            )
            for i in range(sessions)
        )
    )
    return {
        "sessions": sessions,
        "moves": len(results),
        "p50 ms": 1000 * pct(results, 0.5),
        "p90 ms": 1000 * pct(results, 0.9),
        "errors": errors[:5],
        "n errors": len(errors),
        "distinct run tokens": len(set(tokens)),
        "wall s": time.perf_counter() - t0,
        "recorded p50 s": pct(recorded, 0.5),
        "recorded max s": max(recorded) if recorded else float("nan"),
    }


POOL_CLICK = """async ([act, sel]) => {
  const box = document.querySelector(sel);
  const at = (a) => box.querySelector(`[data-act="${a}"]`);
  const tl = box.querySelector('.pkv-timeline');
  if (act === 'step' && at('step').disabled) at('home').click();
  const jump = (v) => { tl.value = String(v); tl.dispatchEvent(new Event('input')); };
  if (act === 'back' && at('back').disabled) jump(tl.max);
  const t0 = performance.now();
  if (act === 'timeline') {
    jump(Math.floor(Math.random() * (Number(tl.max) + 1)));
  } else {
    at(act).click();
  }
  const drawn = Number(box.dataset.paintMs);
  await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
  return [performance.now() - t0, drawn];
}"""


def lesson_export(lesson_id: str = "eviction") -> str:
    """A lesson recorded on the tiny model, as the static export: the lessons' player, for a
    baseline measured side by side with the large-pool player."""
    from kvcore.model import load_model
    from paged_kv_lab.content import BY_ID
    from paged_kv_lab.player import run_payload, static_html
    from paged_kv_lab.run.engine import Engine
    from paged_kv_lab.store.timeline import lesson_scenario

    model = load_model("tiny-random", "cpu")
    sc = lesson_scenario(BY_ID[lesson_id], model.num_layers, model="tiny-random", device="cpu")
    engine = Engine(sc, model=model)
    initial = engine.snapshot()
    records = engine.run()
    return static_html(run_payload(initial, records))


def bench_pool(trace_requests: int, num_gpu_blocks: int, block_size: int, clicks: int) -> None:
    """The large-pool player (Real workloads page) on a replayed window of the shipped trace: the
    recording's cost and size, then Step / Back / timeline jumps in a real browser, click ->
    painted (two animation frames) and the player's own draw time (``data-paint-ms``). No server:
    the window's self-contained HTML (player/pool_payload.py), opened from a file."""
    import tempfile

    from playwright.sync_api import sync_playwright

    from paged_kv_lab.player.pool_payload import pool_payload, pool_static_html
    from paged_kv_lab.workloads.page_data import (
        Settings,
        record_window,
        shipped_trace,
    )
    from paged_kv_lab.workloads.trace_limits import page_trace_limits

    limits = page_trace_limits()
    trace = shipped_trace(0, trace_requests, limits)
    s = Settings(block_size=block_size, num_gpu_blocks=num_gpu_blocks)
    from paged_kv_lab.workloads.replay import Replay

    r = Replay(trace, s.replay_settings(trace))
    r.advance()
    middle = max(1, r.step_count // 2)
    t0 = time.perf_counter()
    w = record_window(trace, s, middle, limits, before=100, after=100)
    rec_s = time.perf_counter() - t0
    payload = pool_payload(
        w.frames, num_gpu_blocks=num_gpu_blocks, block_size=block_size, start=w.start
    )
    size = len(json.dumps(payload, separators=(",", ":")))
    keys = sum(f.keyframe for f in w.frames)
    print(
        f"{trace_requests} requests of the shipped trace, block_size {block_size}, "
        f"{num_gpu_blocks:,} blocks, {r.step_count:,} steps; window of {len(w.frames)} steps "
        f"around step {middle} ({keys} keyframes) recorded in {rec_s:.1f} s (replay to it "
        f"included); payload {size / 1024:.0f} KiB ({size / 1024 / len(w.frames):.1f} KiB a step)"
    )
    with tempfile.TemporaryDirectory() as d, sync_playwright() as pw:
        pool_path, lesson_path = Path(d) / "moment.html", Path(d) / "lesson.html"
        pool_path.write_text(pool_static_html(payload), encoding="utf-8")
        lesson_path.write_text(lesson_export(), encoding="utf-8")
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        pages = {}
        for name, path, sel in (("pool", pool_path, ".pkv-pool"), ("lesson", lesson_path, ".pkv")):
            page = b.new_page(viewport={"width": 1500, "height": 1900})
            page.on("pageerror", lambda e: print(f"| page error: {str(e)[:800]} |", flush=True))
            page.goto(path.as_uri())
            page.wait_for_selector(f"{sel}[data-step]", timeout=60_000)
            pages[name] = (page, sel)
        print(
            "| recorded step, click -> painted (ms) | pool p50 | pool p90 | pool draw p50 | "
            "lesson p50 | lesson p90 | n |\n|---|---:|---:|---:|---:|---:|---:|"
        )
        for act in ("step", "back", "timeline"):
            got: dict = {"pool": [], "lesson": []}
            for _ in range(clicks):  # interleaved: both players under the same load
                for name, (page, sel) in pages.items():
                    page.bring_to_front()
                    got[name].append(page.evaluate(POOL_CLICK, [act, sel]))
            pool, lesson = got["pool"], got["lesson"]
            print(
                f"| {act} | {pct([g[0] for g in pool], 0.5):.1f} | "
                f"{pct([g[0] for g in pool], 0.9):.1f} | {pct([g[1] for g in pool], 0.5):.1f} | "
                f"{pct([g[0] for g in lesson], 0.5):.1f} | "
                f"{pct([g[0] for g in lesson], 0.9):.1f} | {clicks} |",
                flush=True,
            )
        b.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--pool",
        action="store_true",
        help="only the large-pool player of the Real workloads page (no server)",
    )
    ap.add_argument("--pool-requests", type=int, default=60)
    ap.add_argument("--pool-blocks", type=int, default=10_000)
    ap.add_argument("--pool-block-size", type=int, default=16)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--clicks", type=int, default=60)
    ap.add_argument("--sessions", type=int, default=30)
    ap.add_argument("--skip-browser", action="store_true")
    ap.add_argument("--skip-class", action="store_true")
    ap.add_argument(
        "--playground",
        action="store_true",
        help="the class opens one playground scenario per session instead of three lessons",
    )
    ap.add_argument(
        "--payload", action="store_true", help="only the sizes of what is sent (no server)"
    )
    args = ap.parse_args()
    if args.pool:
        print(f"load average before: {os.getloadavg()}")
        bench_pool(args.pool_requests, args.pool_blocks, args.pool_block_size, args.clicks)
        print(f"load average after: {os.getloadavg()}")
        return
    if args.payload:
        print(
            "| lesson | steps | whole snapshots (KiB) | player payload: head + deltas + events + "
            "text (KiB) "
            "| per step (KiB) |\n|---|---:|---:|---:|---:|"
        )
        for row in payload_sizes(args.model):
            print("| %s | %d | %.0f | %.0f | %.1f |" % row)
        return
    proc, url = start_server(args.model)
    try:
        print(f"model {args.model}, cpu; load average before: {os.getloadavg()}")
        if not args.skip_browser:
            print(
                "| measure | p50 | p90 (max for first picture) | n |\n|---|---|---|---|", flush=True
            )
            r = bench_browser(url, proc.pid, args.clicks)
            xs = r["Step at the frontier (ms)"]
            print(
                f"| Step at the frontier (ms) | {pct(xs, 0.5):.0f} | {pct(xs, 0.9):.0f} | "
                f"{len(xs)} |"
            )
        if not args.skip_class:
            rss0 = rss_mb(proc.pid)
            c = asyncio.run(bench_class(url, args.sessions, 10, playground=args.playground))
            what = (
                "playground scenarios, one per session"
                if args.playground
                else "lessons (3 shared runs)"
            )
            print(
                f"\n{c['sessions']} websocket sessions on {what}, {c['moves']} cursor reports: "
                f"p50 {c['p50 ms']:.0f} ms, "
                f"p90 {c['p90 ms']:.0f} ms, errors {c['n errors']} {c['errors']}, "
                f"{c['distinct run tokens']} distinct session runs, {c['wall s']:.0f} s; a "
                "session's run recorded "
                f"after p50 {c['recorded p50 s']:.1f} s (max {c['recorded max s']:.1f} s); server "
                "RSS "
                f"{rss0:.0f} -> {rss_mb(proc.pid):.0f} MB"
            )
        print(f"load average after: {os.getloadavg()}")
    finally:
        stop(proc)


if __name__ == "__main__":
    main()
