"""The run store: recorded runs (store/recorded_run.py), computed once per server process and
shared by every session that plays them.

A run is (model, device, dtype, scenario) -> its StepRecords. The RunStore keeps them in the
server's one cache (runs/server_cache.py: ServerCache, bounded by bytes, which holds everything
else sessions share too), computes the steps that sessions want on one background thread -- one
engine step at a time under the process-wide ENGINE_LOCK, round-robin across runs, so no
session's long run holds the engine from another's -- and lets the cache forget the least
recently used runs nobody holds once its bytes pass its limit. Sessions own only a cursor over
a RecordedRun (store/timeline.py: Timeline). No Streamlit here.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import threading
import time
import uuid
import weakref
from typing import Any, Callable, Optional

from paged_kv_lab.run.budget import (
    BudgetError,
    Limits,
    app_limits,
    check_scenario,
    check_steps,
    prompt_encoder,
)
from paged_kv_lab.run.scenario import Scenario, load_scenario, scenario_to_dict
from paged_kv_lab.store.recorded_run import RecordedRun, estimate_nbytes, run_key
from paged_kv_lab.store.run_files import RunFiles, run_files_from_env
from paged_kv_lab.store.server_cache import (
    DEFAULT_BYTES,
    ENV_BYTES,
    ENV_HARD_BYTES,
    VISITORS,
    OwnedLock,
    ServerCache,
    Shared,
    Visitors,
    default_cache,
)
from paged_kv_lab.store.token_text import decoder_for
from paged_kv_lab.text.i18n import Text

# one forward at a time per process: the weights are shared, the box has 2 cores (an OwnedLock:
# the warm-up never waits for visitors while it holds it, and a page waiting for it is not drawing)
ENGINE_LOCK = OwnedLock()

# the server cache's budget (runs/server_cache.py), under the names it had when it held runs only
ENV_STORE_BYTES = ENV_BYTES
ENV_STORE_HARD_BYTES = ENV_HARD_BYTES
DEFAULT_STORE_BYTES = DEFAULT_BYTES
ENV_BACKGROUND_PAUSE = "PAGED_KV_LAB_BACKGROUND_PAUSE"
DEFAULT_BACKGROUND_PAUSE = 1.0  # computing ahead takes at most half of the time (and of the GIL)
ENV_BACKGROUND_MAX_WAIT = "PAGED_KV_LAB_BACKGROUND_MAX_WAIT"
DEFAULT_BACKGROUND_MAX_WAIT = 2.0  # clicks never starve long work for longer than this

PAGE_POLL_S = 0.05  # while a page is drawn, how often the worker looks whether it still is
EngineFactory = Callable[[Scenario], Any]


def _run_in_use(run: RecordedRun) -> bool:
    """A run some session plays, or one the worker is computing, is not evicted below the hard
    limit."""
    return run.held or run.computing


# -- the store -------------------------------------------------------------------------------
class RunStore:
    """Recorded runs by key in a ServerCache, and a worker that computes wanted steps fairly.

    Invariants: each run's ``nbytes`` is its entry's bytes in the cache; above the cache's
    ``max_bytes`` the least recently used runs no session holds (and the cache's other entries
    not in use) are forgotten; above ``hard_bytes`` held runs go too (their sessions keep what
    was recorded and are told why no more steps come). A run is made once per key: a second
    session asking for it meanwhile waits for the first. The worker holds the engine lock for
    one step at a time and visits runs with work in turn.

    Two classes of work: a step some session is blocked on at its frontier (a click: "urgent") and
    everything else (steps computed ahead, Run to end, a far step, Play). Urgent steps go first,
    round-robin among themselves. Other work starts only after an idle gap of ``background_pause``
    times the last step's duration with nobody waiting -- a session that just got its step usually
    clicks again within that gap, and its next step must not queue behind work ahead -- and while
    no session draws a page (``visitors``: store/server_cache.py's VISITORS, a page that opens
    gets the cores first) -- except that once other work has waited ``background_max_wait``
    seconds it gets one step even under clicks or pages, so it is slowed but never starved.

    ``cache``: the cache the runs go in; without one the store has a cache of its own, bounded
    by ``max_bytes`` / ``hard_bytes`` (else the environment's budget). The process's store
    (``default_store``) uses the process's cache (``default_cache``).
    """

    def __init__(
        self,
        max_bytes: Optional[int] = None,
        hard_bytes: Optional[int] = None,
        max_steps: Optional[int] = None,
        lock: Optional[threading.Lock] = None,
        limits: Optional[Limits] = None,
        background_pause: Optional[float] = None,
        background_max_wait: Optional[float] = None,
        cache: Optional[ServerCache] = None,
        visitors: Optional[Visitors] = None,
        files: Optional[RunFiles] = None,
    ) -> None:
        env = os.environ
        if background_pause is None:
            background_pause = float(env.get(ENV_BACKGROUND_PAUSE, DEFAULT_BACKGROUND_PAUSE))
        if background_max_wait is None:
            background_max_wait = float(
                env.get(ENV_BACKGROUND_MAX_WAIT, DEFAULT_BACKGROUND_MAX_WAIT)
            )
        if cache is not None and (max_bytes is not None or hard_bytes is not None):
            raise ValueError("a store in a given cache has that cache's limits")
        self.cache = cache if cache is not None else ServerCache(max_bytes, hard_bytes)
        self.cond = self.cache.cond  # the cache's condition: runs and the cache change under it
        self._kind: Shared[RecordedRun] = Shared(
            "runs",
            size=lambda run: run.nbytes,
            in_use=_run_in_use,
            on_evict=self._forgotten,
            on_insert=self._register,
            keep_errors=False,  # a refusal depends on the limits asked with: not kept
            cache=self.cache,
        )
        self.limits = limits if limits is not None else app_limits()
        self.max_steps = int(max_steps if max_steps is not None else self.limits.max_run_steps)
        self.lock = lock if lock is not None else ENGINE_LOCK
        self.visitors = visitors if visitors is not None else VISITORS
        self._rr: list[RecordedRun] = []  # the runs in the worker's round-robin order
        self.steps_computed = 0
        # keys of the last steps computed (tests read the interleaving)
        self.step_log: list[str] = []
        self.background_pause = background_pause  # idle gap before other work, per last step's time
        self.background_max_wait = background_max_wait
        self._last_step_end = 0.0  # perf_counter at the end of the last step (any kind)
        self._last_step_time = 0.0
        # when other work last got a step (None: none pending)
        self._background_since: Optional[float] = None
        self._worker: Optional[threading.Thread] = None
        self._closed = False
        # finished runs on disk (store/run_files.py), shared with other processes of this code
        self.files = files
        _OPEN_STORES.add(self)

    @property
    def max_bytes(self) -> int:
        return self.cache.max_bytes

    @property
    def hard_bytes(self) -> int:
        return self.cache.hard_bytes

    @property
    def total_bytes(self) -> int:
        """The bytes of the store's cache: its runs and whatever else the cache holds."""
        return self.cache.total_bytes

    # -- getting runs -----------------------------------------------------------------------
    def run(
        self,
        scenario: Scenario,
        factory: EngineFactory,
        model_key: Any = None,
        model: Any = None,
        limits: Optional[Limits] = None,
    ) -> RecordedRun:
        """The shared run of ``scenario`` on the model ``model_key`` names; created (after the
        budget check, with the engine built under the engine lock) if the store does not hold it.
        ``model_key=None`` makes a private run nobody else shares (an opaque factory)."""
        key = (
            run_key(model_key, scenario) if model_key is not None else "private:" + uuid.uuid4().hex
        )

        def make() -> RecordedRun:
            checked = limits or self.limits
            config = getattr(model, "config", None)
            with self.lock:
                if scenario.engine.lora_modules:
                    # a visitor's file names no folder of this server for the engine to read
                    raise BudgetError(Text("refusal.lora_modules"))
                check_scenario(scenario, checked, config, prompt_encoder(model))
            kept = self._kept_run(key, scenario, model)
            if kept is not None:
                return kept
            with self.lock:
                engine = factory(scenario)
                initial = engine.snapshot()
                self._drain(engine)
            engine_bytes = 0
            if getattr(engine, "model", None) is not None:
                try:
                    engine_bytes = int(engine.bytes_per_block()) * scenario.engine.num_gpu_blocks
                except Exception:
                    engine_bytes = 0
            run = RecordedRun(
                key,
                scenario,
                initial,
                store=self,
                engine=engine,
                engine_bytes=engine_bytes,
                decode=decoder_for(model),
            )
            if not engine.has_unfinished():
                with self.cond:
                    self._finish(run, None, engine.outputs())
            return run

        return self._kind.get(key, make)

    def _kept_run(self, key: str, scenario: Scenario, model: Any) -> Optional[RecordedRun]:
        """The finished run of ``key`` from the run files, if this code wrote one that fits the
        store's step cap (its budget checks passed already), else None."""
        if self.files is None or key.startswith("private:"):
            return None
        trace = self.files.load(key)
        if trace is None or len(trace.records) > self.max_steps:
            return None
        return self._finished_run(key, scenario, trace, decode=decoder_for(model))

    def _finished_run(self, key: str, scenario: Any, read, **kw: Any) -> RecordedRun:
        """A run read whole from a trace (an uploaded file, the run files): nothing to compute."""
        return RecordedRun(
            key,
            scenario,
            read.initial,
            store=self,
            records=read.records,
            done=True,
            outputs=read.outputs,
            **kw,
        )

    def _keep(self, run: RecordedRun) -> None:
        """Write a run that reached its end with no error to the run files (outside the store's
        condition: a file is written and read back, which sessions need not wait for)."""
        if self.files is None or run.key.startswith("private:") or run.scenario is None:
            return
        if run.error is not None or run.initial is None or run.outputs() is None:
            return
        try:
            self.files.save(
                run.key, scenario_to_dict(run.scenario), run.initial, run.records, run.outputs()
            )
        except Exception:  # a disk that refuses costs a later recomputation, nothing else
            pass

    def trace_run(self, trace) -> RecordedRun:
        """A trace file as a finished run (nothing computed); identical files share one."""
        check_steps(len(trace.records), self.limits)
        key = "trace:" + hashlib.sha256(trace.to_jsonl().encode()).hexdigest()[:32]

        def make() -> RecordedRun:
            scenario = load_scenario(trace.scenario) if trace.scenario is not None else None
            return self._finished_run(key, scenario, trace, trace=trace)

        return self._kind.get(key, make)

    def __len__(self) -> int:
        return len(self._kind.values())

    def __contains__(self, key: str) -> bool:
        return self._kind.ready(key)

    def runs(self) -> list[RecordedRun]:
        return self._kind.values()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the worker after the step it is computing, if any; runs stay readable."""
        with self.cond:
            self._closed = True
            self.cond.notify_all()
        if self._worker is not None and self._worker is not threading.current_thread():
            self._worker.join(timeout=timeout)

    # -- what sessions ask (store/recorded_run.py)
    # --------------------------------------------------
    def want(self, run: RecordedRun, n: int) -> None:
        """Compute ``run`` up to ``n`` steps (capped at ``max_steps``)."""
        with self.cond:
            if run.ask(min(int(n), self.max_steps)) and self._holds(run) and run.computing:
                self._ensure_worker()
                self.cond.notify_all()

    def touch(self, run: RecordedRun) -> None:
        """A session took ``run`` up: it becomes the cache's most recently used entry."""
        self.cache.touch(self._kind, run.key, run)

    # -- bookkeeping (under self.cond) --------------------------------------------------------
    def _holds(self, run: RecordedRun) -> bool:
        return self.cache.holds(self._kind, run.key, run)

    def _register(self, run: RecordedRun) -> None:
        """The cache stored a new run: it joins the worker's round."""
        self._rr.append(run)

    def _forgotten(self, run: RecordedRun, hard_total: Optional[int]) -> None:
        """The cache forgot ``run`` (``hard_total``: its bytes when its hard limit made it)."""
        if run in self._rr:
            self._rr.remove(run)
        if hard_total is not None:
            run.drop(
                f"the server's run store is full ({hard_total:,} bytes; "
                f"{ENV_STORE_HARD_BYTES}={self.hard_bytes:,}); no more steps of this run",
                (
                    "store_full",
                    {
                        "bytes": f"{hard_total:,}",
                        "var": ENV_STORE_HARD_BYTES,
                        "limit": f"{self.hard_bytes:,}",
                    },
                ),
            )
        else:
            run.drop("this run was dropped from the server's run store", ("dropped", {}))
        self.cond.notify_all()

    def _ensure_worker(self) -> None:
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._loop, name="run-store-worker", daemon=True)
            self._worker.start()

    def _finish(
        self, run: RecordedRun, error: Optional[str], outputs: Optional[dict] = None
    ) -> None:
        run.finish(error, outputs)
        self.cache.resize(self._kind, run.key, run, run.nbytes)  # its engine's bytes went
        self.cond.notify_all()

    def _next_run(self, background: bool) -> Optional[RecordedRun]:
        """The next run to step, round-robin after the last one served: a run some session waits
        for at its frontier, else (when ``background``) any run with wanted steps."""
        ready = []
        for i, run in enumerate(self._rr):
            if run.abandoned:
                run.stop_computing()  # every session left: stop computing it
            if run.computing and run.engine is not None:
                ready.append(i)
        if not ready:
            self._background_since = None
            return None
        urgent = [i for i in ready if self._rr[i].waited_for]
        others = [i for i in ready if not self._rr[i].waited_for]
        now = time.perf_counter()
        if not others:
            self._background_since = None
        elif self._background_since is None:
            self._background_since = now
        starved = bool(others) and now - self._background_since >= self.background_max_wait
        if urgent and not starved:
            i = urgent[0]
        elif others and (background or starved):
            i = others[0]
            self._background_since = None  # served: its wait starts again
        else:
            return None
        run = self._rr.pop(i)
        self._rr.append(run)  # served now, so it goes to the back of the line
        return run

    # -- the worker ---------------------------------------------------------------------------
    @staticmethod
    def _drain(engine) -> None:
        """Take the engine's KV-cache events: nobody here publishes them, so the queue must not
        grow."""
        take = getattr(engine, "take_kv_events", None)
        if take is not None:
            take()

    def _gap_left(self) -> float:
        """Seconds until other work may start: the idle gap after the last step not yet over."""
        return (
            self._last_step_end + self.background_pause * self._last_step_time - time.perf_counter()
        )

    def _loop(self) -> None:
        while True:
            with self.cond:
                while not self._closed:
                    gap = self._gap_left()
                    drawn = self.visitors.busy(ahead=True)  # a page being drawn goes first
                    run = self._next_run(background=gap <= 0 and not drawn)
                    if run is not None:
                        break
                    # nothing urgent: sleep out the gap (or until work comes; a waiter wakes us),
                    # or look again soon while a page is drawn (its end notifies no one here)
                    if not self._has_work():
                        wait = 30.0
                    else:
                        wait = PAGE_POLL_S if drawn else gap if gap > 0 else 30.0
                    self.cond.wait(timeout=wait)
                if self._closed:
                    return
                engine = run.engine
            t0 = time.perf_counter()
            self._step(run, engine)
            with self.cond:
                self._last_step_end = time.perf_counter()
                self._last_step_time = self._last_step_end - t0

    def _has_work(self) -> bool:
        return any(r.computing and r.engine is not None for r in self._rr)

    def _step(self, run: RecordedRun, engine) -> None:
        outputs = None
        try:
            with self.lock:
                rec = engine.step()
                self._drain(engine)
                finished = not engine.has_unfinished()
                capped = not finished and rec.step >= self.max_steps
                if finished or capped:
                    outputs = engine.outputs()
        except Exception as e:  # one run's failure never stops the worker or other runs
            with self.cond:
                if not run.done:
                    self._finish(
                        run, f"step {len(run.records) + 1} failed: {type(e).__name__}: {e}"
                    )
            return
        size = estimate_nbytes(rec)
        with self.cond:
            if run.done:  # dropped while this step ran
                return
            run.add_record(rec, size)
            self.cache.resize(self._kind, run.key, run, run.nbytes)
            self.steps_computed += 1
            self.step_log.append(run.key)
            del self.step_log[:-200]
            if finished:
                self._finish(run, None, outputs)
            elif capped:
                run.capped_at = self.max_steps
                self._finish(
                    run,
                    f"stopped after {rec.step} steps: this server computes at most "
                    f"{self.max_steps} steps per run (PAGED_KV_LAB_MAX_RUN_STEPS)",
                    outputs,
                )
            self.cache.evict()  # over the hard limit the growing run itself may have to stop
            self.cond.notify_all()
        if finished:
            self._keep(run)


_STORE: Optional[RunStore] = None
_STORE_LOCK = threading.Lock()


# Every store still open, closed at interpreter exit: the worker is a daemon thread, and one
# killed in the middle of a model step while the interpreter tears down can abort the process.
_OPEN_STORES: "weakref.WeakSet[RunStore]" = weakref.WeakSet()


@atexit.register
def _close_open_stores() -> None:
    for store in list(_OPEN_STORES):
        store.close(timeout=30.0)


def default_store() -> RunStore:
    """The process-wide store, in the process-wide cache (runs/server_cache.py: default_cache;
    its budget from the environment at first use), with the run files of this code
    (store/run_files.py: finished runs other processes computed are played, not computed again)."""
    global _STORE
    with _STORE_LOCK:
        if _STORE is None:
            _STORE = RunStore(cache=default_cache(), files=run_files_from_env())
        return _STORE
