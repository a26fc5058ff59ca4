"""Prefill here, decode there: two engines and the proxy between them (vLLM's disaggregated
prefill with the NIXL connector, as its toy P/D proxy drives it).

Both replicas are :class:`paged_kv_lab.run.engine.Engine`\\ s built from the same scenario and
sharing one loaded model (one copy of the weights, a KV pool each). A request goes first to the
prefill replica with ``max_tokens = 1`` and ``kv_transfer_params = {"do_remote_decode": True}``;
when it finishes there, the params it returns (its blocks' ids, its engine id) go with the
original request to the decode replica, which pulls the K/V and generates. The decode replica's
outputs are the run's outputs.

One tick steps the prefill replica, hands its finished requests on, then steps the decode
replica; the records of both, in that order, are numbered 1, 2, 3... as one run's steps, so a
trace file holds them in the plain format.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Optional

from kvcore.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from kvcore.distributed.kv_transfer.kv_connector.v1.nixl.connector import NixlConnector
from kvcore.distributed.kv_transfer.kv_connector.v1.nixl.pull_worker import NixlAgentRegistry
from paged_kv_lab.recording.snapshot import StepRecord
from paged_kv_lab.run.driver import run_kind_for, run_to_end
from paged_kv_lab.run.engine import Engine
from paged_kv_lab.run.scenario import KVTransferConfig, RequestSpec, Scenario

PREFILL, DECODE = "prefill", "decode"
REPLICAS = (PREFILL, DECODE)


def check_pd(scenario: Scenario) -> None:
    """ValueError for the settings the P/D pair does not model."""
    s = scenario.engine
    if s.cpu_offload is not None:
        raise ValueError("engine.kv_transfer pd is modelled without engine.cpu_offload")
    if s.speculative is not None:
        raise ValueError("engine.kv_transfer pd is modelled without engine.speculative")
    if s.sliding_window is not None or s.layer_types is not None:
        raise ValueError("engine.kv_transfer pd is modelled for full-attention layers only")
    for r in scenario.requests:
        if r.n > 1:
            raise ValueError(f"request {r.id!r}: engine.kv_transfer pd is modelled for n = 1")


class PDEngine:
    """A prefill replica, a decode replica and the proxy between them.

    Invariants: a request reaches the decode replica only once the prefill replica finished
    it; the prefill replica's blocks of a request stay allocated until the decode replica's
    pull said it is done (or the lease ran out); same scenario -> same steps, every run.

    A driver (paged_kv_lab/run/driver.py) whose unit is a tick: ``step()`` returns the records
    of the replicas that had work in it, and ``kv_events()`` their KV events in that order.
    """

    def __init__(
        self,
        scenario: Scenario,
        model=None,
        runner_factory: Optional[Callable[[], object]] = None,
        debug: bool = False,
        kv_load_failure_policy: Optional[str] = None,
        fail_loads: Optional[tuple[str, ...]] = None,
        kv_lease_steps: int = 30,
        pool_sizes: Optional[dict[str, int]] = None,
    ) -> None:
        """``pool_sizes``: num_gpu_blocks per replica where it differs from the scenario's;
        ``kv_load_failure_policy`` and ``fail_loads``: the scenario's
        ``engine.kv_transfer_config`` where not given."""
        check_pd(scenario)
        conf = scenario.engine.kv_transfer_config or KVTransferConfig()
        if kv_load_failure_policy is None:
            kv_load_failure_policy = conf.kv_load_failure_policy
        if fail_loads is None:
            fail_loads = conf.fail_loads
        self.scenario = scenario
        self.registry = NixlAgentRegistry()
        bare = replace(scenario, requests=())
        if model is None and runner_factory is None:
            from kvcore.model import load_model

            model = load_model(scenario.model, scenario.device, scenario.dtype)
        self.model = model
        self.engines: dict[str, Engine] = {}
        for name in REPLICAS:
            sched = NixlConnector(
                KVConnectorRole.SCHEDULER,
                name,
                scenario.engine.block_size,
                kv_lease_steps=kv_lease_steps,
            )
            worker = NixlConnector(
                KVConnectorRole.WORKER, name, scenario.engine.block_size, self.registry
            )
            own = bare
            if pool_sizes and name in pool_sizes:
                own = replace(bare, engine=replace(bare.engine, num_gpu_blocks=pool_sizes[name]))
            self.engines[name] = Engine(
                own,
                model=model,
                runner=runner_factory() if runner_factory is not None else None,
                debug=debug,
                kv_connectors=(sched, worker, kv_load_failure_policy),
            )
        self.decode_worker.fail_load_req_ids = set(fail_loads)
        self.step_count = 0
        self.tick = 0
        self._pending: list[RequestSpec] = sorted(scenario.requests, key=lambda r: r.arrival_step)
        self.specs: dict[str, RequestSpec] = {}  # every request sent, in arrival order
        self.history: list[StepRecord] = []
        self._last: list[StepRecord] = []  # the last tick's records
        for spec in self._pending:
            for e in self.engines.values():
                e._checked_prompt(spec)

    @property
    def prefill(self) -> Engine:
        return self.engines[PREFILL]

    @property
    def decode_engine(self) -> Engine:
        return self.engines[DECODE]

    @property
    def decode_worker(self):
        return self.decode_engine.engine_core.kv_connector.connector_worker

    @property
    def prefill_connector(self):
        return self.prefill.kv_connector.connector_scheduler

    # -- requests -------------------------------------------------------------------------
    def add_request(self, spec: RequestSpec) -> None:
        """The proxy's first leg: the prompt to the prefill replica, for one token."""
        if spec.n > 1:
            raise ValueError(f"request {spec.id!r}: engine.kv_transfer pd is modelled for n = 1")
        if spec.id in self.specs:
            raise ValueError(f"a request with id {spec.id!r} already exists")
        self.prefill.add_request(
            replace(spec, max_tokens=1, arrival_step=0), {"do_remote_decode": True}
        )
        self.specs[spec.id] = spec

    def has_unfinished(self) -> bool:
        return bool(self._pending) or any(e.has_unfinished() for e in self.engines.values())

    # -- stepping -------------------------------------------------------------------------
    def step(self) -> list[StepRecord]:
        """One tick: the prefill replica's step, the hand-over, the decode replica's step.
        Returns the records of the replicas that had work, numbered on from the last, each
        naming its replica and the pulls its connector made (StepRecord.replica, .pulls)."""
        self.tick += 1
        while self._pending and self._pending[0].arrival_step < self.tick:
            self.add_request(self._pending.pop(0))
        out = []
        if self.prefill.has_unfinished():
            rec = self.prefill.step()
            if rec.scheduled or rec.events:
                out.append(self._numbered(PREFILL, rec))
            params = self.prefill_connector.kv_transfer_params_out
            for rid in list(params):
                self.decode_engine.add_request(
                    replace(self.specs[rid], arrival_step=0), params.pop(rid)
                )
        if self.decode_engine.has_unfinished():
            pulls = self.decode_worker.pulls
            rec = self.decode_engine.step()
            if rec.scheduled or rec.events:
                out.append(self._numbered(DECODE, rec, dict(pulls)))
            pulls.clear()
        self.history += out
        self._last = out
        return out

    def kv_events(self) -> tuple:
        """The KV cache events of the last tick: the prefill replica's, then the decode's."""
        return tuple(e for rec in self._last for e in rec.kv_events)

    def _numbered(self, replica: str, rec: StepRecord, pulls=None) -> StepRecord:
        self.step_count += 1
        n = self.step_count
        return replace(
            rec,
            step=n,
            snapshot=replace(rec.snapshot, step=n),
            replica=replica,
            pulls=dict(pulls or {}),
        )

    def run(self, max_ticks: int = 100_000) -> list[StepRecord]:
        steps = []
        while self.has_unfinished() and self.tick < max_ticks:
            steps += self.step()
        return steps

    # -- reading --------------------------------------------------------------------------
    def snapshot(self):
        """The decode replica's pool (the trace header's state before step 1)."""
        return self.decode_engine.snapshot()

    def decode(self, token_ids) -> str:
        return self.decode_engine.decode(token_ids)

    def outputs(self) -> dict[str, dict]:
        """The decode replica's outputs, in the order the requests were sent (a request still
        at the prefill replica has none yet)."""
        got = self.decode_engine.outputs()
        empty = {"token_ids": [], "text": "", "finish_reason": None}
        return {rid: got.get(rid, empty) for rid in self.specs}

    def parents(self) -> dict[str, list[str]]:
        return {}

    def close(self) -> None:
        for e in self.engines.values():
            e.close()


class PDRun:
    """A P/D pair as the run store steps an engine: one StepRecord per ``step()`` call, the two
    replicas' records in the order the pair made them (a tick with two records gives two calls).

    Invariants: the records come out numbered 1, 2, 3... with none skipped or repeated, each
    naming its replica (``StepRecord.replica``) and the pulls it made (``StepRecord.pulls``);
    ``has_unfinished()`` is false only when the pair is done and nothing is queued.

    A driver (paged_kv_lab/run/driver.py): ``add_request(RequestSpec)`` (the proxy's first leg),
    ``step() -> StepRecord``, ``kv_events()`` (the events of the record last returned),
    ``outputs()`` (the decode replica's).
    """

    def __init__(self, pair: PDEngine, max_idle_ticks: int = 1_000) -> None:
        self.pair = pair
        self.model = pair.model
        self.max_idle_ticks = max_idle_ticks
        self._queue: list[StepRecord] = []
        self._last: Optional[StepRecord] = None

    def add_request(self, spec: RequestSpec) -> None:
        """Send ``spec`` to the pair now (its prefill replica first)."""
        self.pair.add_request(spec)

    def has_unfinished(self) -> bool:
        return bool(self._queue) or self.pair.has_unfinished()

    def step(self) -> StepRecord:
        """The next record; ticks the pair until one of its replicas had work."""
        idle = 0
        while not self._queue:
            if not self.pair.has_unfinished() or idle >= self.max_idle_ticks:
                raise RuntimeError("the P/D pair has no step left to make")
            self._queue += self.pair.step()
            idle += 1
        self._last = self._queue.pop(0)
        return self._last

    def kv_events(self) -> tuple:
        return self._last.kv_events if self._last is not None else ()

    def run(self, max_steps: int = 100_000) -> list[StepRecord]:
        """Step until both replicas are done (as Engine.run without ``until``)."""
        return run_to_end(self, max_steps)

    def snapshot(self):
        return self.pair.snapshot()

    def decode(self, token_ids) -> str:
        return self.pair.decode(token_ids)

    def outputs(self) -> dict[str, dict]:
        return self.pair.outputs()

    def parents(self) -> dict[str, list[str]]:
        return {}

    def bytes_per_block(self) -> int:
        """Both pools' bytes per block id (each replica holds one block of each id)."""
        return sum(e.bytes_per_block() for e in self.pair.engines.values())

    def close(self) -> None:
        self.pair.close()


@dataclass(frozen=True)
class TTFTSplit:
    """A request's time to first token on a P/D pair, read from the recorded steps (their
    measured ``seconds``): the prefill replica's step that computed the prompt, the decode
    replica's step that pulled the K/V, the steps in between and after it until the step that
    sampled the first decode token (``waiting``), that step, and their sum."""

    request_id: str
    prefill_ms: float
    transfer_ms: float
    waiting_ms: float
    first_decode_ms: float

    @property
    def total_ms(self) -> float:
        return self.prefill_ms + self.transfer_ms + self.waiting_ms + self.first_decode_ms


def ttft_split(records: list[StepRecord]) -> list[TTFTSplit]:
    """The split of each request whose first decode token is among ``records`` (a P/D run's,
    numbered 1, 2, 3...): the one computation of it, for the page, the CLI and the tests. A
    request's prefill step is the one it finished in while still holding its blocks (the prefill
    replica kept them for the pull); its transfer step the one that left it waiting for remote
    K/V."""
    ms = [1000 * r.seconds for r in records]
    kept: dict[str, int] = {}
    pulled: dict[str, int] = {}
    out = []
    for i, rec in enumerate(records):
        held = {r.request_id: r for r in rec.snapshot.requests}
        for e in rec.events:
            r = held.get(e.request_id or "")
            if r is None:
                continue
            if e.kind == "finished" and any(r.block_tables) and e.request_id not in kept:
                kept[e.request_id] = i
            if r.status == "waiting_for_remote_kvs" and e.request_id not in pulled:
                pulled[e.request_id] = i
        for rid in rec.new_tokens:
            p, t = kept.get(rid), pulled.pop(rid, None)
            if p is None or t is None or t >= i:
                if t is not None:
                    pulled[rid] = t
                continue
            out.append(TTFTSplit(rid, ms[p], ms[t], sum(ms[t + 1 : i]), ms[i]))
    return out


# A block's part in a P/D pair at a step, as the pools side by side mark it (the first that
# holds, in this order): the current step's pull read it (prefill) or filled it (decode); the pull
# into it failed; kept for a transfer by a finished request (prefill); allocated for a pull and
# not cached until the load lands (decode); in use; free but cached; free.
BLOCK_PARTS = ("pull_from", "pull_into", "failed", "kept", "delayed", "used", "cached", "free")


@dataclass(frozen=True)
class PairBlock:
    """One block of one replica's pool at a step of a P/D run: its ``part`` (BLOCK_PARTS), the
    requests whose tables hold it, and, in the step's pull, the other side's block id."""

    block_id: int
    part: str
    owners: tuple[str, ...]
    paired: Optional[int] = None


@dataclass(frozen=True)
class PairView:
    """Both pools of a P/D pair at step ``step`` of its run. ``as_of[r]`` is the step whose
    snapshot ``blocks[r]`` shows (replica r's latest step up to ``step``; 0: the state before
    step 1); ``replica`` made ``step`` (None at step 0); ``pulls`` are that step's pulls.

    Invariants: a block is ``pull_from`` on the prefill side exactly when its id is among a pull's
    prefill ids, and the block it pairs with is ``pull_into`` on the decode side, and the other
    way round; ``kept`` only on the prefill side, ``delayed`` and ``failed`` only on the decode
    side."""

    step: int
    replica: Optional[str]
    as_of: dict[str, int]
    blocks: dict[str, tuple[PairBlock, ...]]
    pulls: dict[str, tuple[tuple[int, ...], tuple[int, ...]]]
    failed: dict[str, tuple[int, ...]]  # request -> decode blocks whose pull failed this step


def pair_at(initial, records: list[StepRecord], step: int) -> PairView:
    """Both pools at ``step`` of a P/D run, from its records (numbered 1, 2, 3...) and the state
    before step 1 (``initial``: both replicas' pools start as it is, empty)."""
    shown = [r for r in records if r.step <= step]
    latest: dict[str, tuple[int, object]] = {name: (0, initial) for name in REPLICAS}
    for r in shown:
        if r.replica in latest:
            latest[r.replica] = (r.step, r.snapshot)
    now = shown[-1] if shown and shown[-1].step == step else None
    pulls = dict(now.pulls) if now is not None else {}
    failed = {
        e.request_id: tuple(e.block_ids)
        for e in (now.events if now is not None and now.replica == DECODE else ())
        if e.kind == "kv_load_failed"
    }
    pairs = {
        PREFILL: {p: d for rp, rd in pulls.values() for p, d in zip(rp, rd)},
        DECODE: {d: p for rp, rd in pulls.values() for p, d in zip(rp, rd)},
    }
    failed_ids = {b for ids in failed.values() for b in ids}
    blocks = {}
    for name, (_, snap) in latest.items():
        if snap is None:  # a trace without its header, before this replica's first step
            blocks[name] = ()
            continue
        status = {v.request_id: v.status for v in snap.requests}
        cells = []
        for b in snap.blocks:
            if b.is_null:
                continue
            states = {status.get(o, "") for o in b.owners}
            if b.block_id in pairs[name]:
                part = "pull_from" if name == PREFILL else "pull_into"
            elif name == DECODE and b.block_id in failed_ids:
                part = "failed"
            elif name == PREFILL and any(x.startswith("finished") for x in states):
                part = "kept"
            elif name == DECODE and b.block_hash is None and "waiting_for_remote_kvs" in states:
                part = "delayed"
            elif b.ref_cnt > 0:
                part = "used"
            else:
                part = "cached" if b.block_hash else "free"
            cells.append(PairBlock(b.block_id, part, b.owners, pairs[name].get(b.block_id)))
        blocks[name] = tuple(cells)
    return PairView(
        step,
        now.replica if now is not None else None,
        {name: s for name, (s, _) in latest.items()},
        blocks,
        pulls,
        failed,
    )


def engine_for(scenario: Scenario, model=None):
    """What steps ``scenario`` one StepRecord at a time: an Engine, or, for ``engine.kv_transfer
    = "pd"``, a prefill and a decode replica on the one model (PDRun)."""
    if scenario.engine.kv_transfer == "pd":
        return PDRun(PDEngine(scenario, model=model))
    kind = run_kind_for(scenario)  # a kind another package registered (a fleet)
    if kind is not None:
        return kind(scenario, model=model)
    if getattr(scenario.engine, "fleet", None) is not None:
        raise ValueError(
            "engine.fleet runs replicas behind a router: import paged_kv_lab.fleet.model_fleet, "
            "which builds them"
        )
    return Engine(scenario, model=model)
