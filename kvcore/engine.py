"""Engine: schedule -> run the model -> update requests -> record, one step at a time."""
from __future__ import annotations

import zlib
from dataclasses import replace
from typing import Callable, Optional

from kvcore import events, snapshot
from kvcore.batch import SeqBatchItem
from kvcore.invariants import check_invariants
from kvcore.kv.block_hash import BlockHasher, get_hash_fn
from kvcore.kv.kv_cache_coordinator import KVCacheGroupSpec
from kvcore.kv.kv_cache_manager import KVCacheManager
from kvcore.sched.request import Request
from kvcore.sched.scheduler import Scheduler, SchedulerConfig
from kvcore.scenario import EngineSettings, RequestSpec, Scenario
from kvcore.snapshot import take_snapshot


def kv_cache_groups(settings: EngineSettings, num_layers: int) -> tuple[list[KVCacheGroupSpec], list[int]]:
    """KV cache groups and, per decoder layer, the group it reads.

    No window: one full-attention group. A window without layer_types: every layer
    slides, one sliding group. A mix: group 0 = full layers, group 1 = sliding layers.
    """
    W = settings.sliding_window
    types = settings.layer_types
    if types is None:
        types = ("sliding_attention" if W else "full_attention",) * num_layers
    if len(types) != num_layers:
        raise ValueError(f"engine.layer_types lists {len(types)} layers but the model has {num_layers}")
    kinds = sorted(set(types), key=lambda t: t != "full_attention")
    groups = [KVCacheGroupSpec("full") if k == "full_attention" else KVCacheGroupSpec("sliding", W)
              for k in kinds]
    return groups, [kinds.index(t) for t in types]


class NoModelRunner:
    """Stands in for the model when only the block manager is studied (benchmarks,
    property tests): the next token is a fixed function of the request and its length."""

    def __init__(self, vocab_size: int = 1000, eos_token_id: Optional[int] = None) -> None:
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id

    def execute(self, items) -> dict[str, int]:
        out = {}
        for it in items:
            if it.sample:
                seed = zlib.crc32(it.request_id.encode()) + 7919 * (it.start_pos + len(it.token_ids))
                out[it.request_id] = seed % self.vocab_size
        return out


class Engine:
    """Drives one scenario. Same scenario -> same tokens, block ids and trace, every run."""

    def __init__(self, scenario: Scenario, model=None, runner=None, debug: bool = False,
                 progress: Optional[Callable[[str], None]] = None) -> None:
        s = scenario.engine
        self.scenario = scenario
        self.settings = s
        self.debug = debug
        self.model = None
        if runner is None:
            from kvcore.model import load_model
            self.model = model if model is not None else load_model(
                scenario.model, scenario.device, scenario.dtype, progress=progress)
            cfg = self.model.config
            num_layers = cfg.num_hidden_layers
            max_len = getattr(cfg, "max_position_embeddings", 8192)
        else:
            self.model = model
            num_layers = 1 if s.layer_types is None else len(s.layer_types)
            max_len = 1 << 20
        self.groups, layer_group = kv_cache_groups(s, num_layers)
        self.max_model_len = s.max_model_len or max_len
        self.recorder = events.Recorder()
        self.hash_fn = get_hash_fn(s.hash_algo)
        self.hasher = BlockHasher(self.hash_fn, s.block_size)
        self.kv_cache_manager = KVCacheManager(
            s.num_gpu_blocks, s.block_size, self.groups, s.enable_prefix_caching,
            self.max_model_len, s.free_order, s.sliding_retention, self.recorder)
        self.scheduler = Scheduler(SchedulerConfig(
            max_num_seqs=s.max_num_seqs, max_num_batched_tokens=s.max_num_batched_tokens,
            policy=s.policy, max_model_len=self.max_model_len, admission=s.admission,
            long_prefill_token_threshold=s.long_prefill_token_threshold),
            self.kv_cache_manager, self.recorder)
        if runner is None:
            from kvcore.model import ModelRunner
            runner = ModelRunner(self.model, s.num_gpu_blocks, s.block_size, layer_group,
                                 [g.sliding_window for g in self.groups], seed=s.seed)
        self.runner = runner
        self.step_count = 0
        self._arrivals = 0
        self._pending: list[RequestSpec] = sorted(scenario.requests, key=lambda r: r.arrival_step)
        self.history: list[snapshot.StepRecord] = []
        # Refuse a scenario whose prompt can never fit now, not in the middle of a run.
        for spec in self._pending:
            self._checked_prompt(spec)
        if self.debug:
            self.check_invariants()

    # -- requests -----------------------------------------------------------------------
    def _eos_ids(self) -> tuple[int, ...]:
        if self.model is None:
            return (self.runner.eos_token_id,) if getattr(self.runner, "eos_token_id", None) is not None else ()
        eos = self.model.eos_token_id
        return tuple(eos) if isinstance(eos, (list, tuple)) else ((eos,) if eos is not None else ())

    def encode(self, spec: RequestSpec) -> list[int]:
        if spec.prompt_token_ids is not None:
            ids = list(spec.prompt_token_ids)
            vocab = getattr(getattr(self.model, "config", None), "vocab_size", None)
            if vocab is not None and any(t >= vocab for t in ids):
                raise ValueError(f"request {spec.id!r}: token ids must be < vocab size {vocab}")
            return ids
        if self.model is None:
            raise ValueError(f"request {spec.id!r}: a text prompt needs a model with a tokenizer")
        return self.model.encode_prompt(spec.prompt, spec.chat)

    def add_request(self, spec: RequestSpec) -> None:
        """Queue a request now (its arrival_step is ignored). Raises ValueError, changing
        nothing, if it is malformed or can never fit in the pool."""
        if spec.id in self.scheduler.requests:
            raise ValueError(f"a request with id {spec.id!r} already exists")
        ids = self._checked_prompt(spec)
        s = self.settings
        self._arrivals += 1
        req = Request(spec.id, ids, spec.max_tokens, arrival_time=self._arrivals,
                      priority=spec.priority, cache_salt=spec.cache_salt,
                      eos_token_ids=self._eos_ids(), ignore_eos=spec.ignore_eos,
                      block_hasher=self.hasher if s.enable_prefix_caching else None)
        self.scheduler.add_request(req)

    def _checked_prompt(self, spec: RequestSpec) -> list[int]:
        """The prompt's token ids; ValueError if the prompt alone can never fit."""
        ids = self.encode(spec)
        s = self.settings
        full_groups = sum(1 for g in self.groups if g.kind == "full")
        usable = s.num_gpu_blocks - 1
        need = -(-len(ids) // s.block_size) * full_groups
        if need > usable:
            raise ValueError(
                f"request {spec.id!r}: its prompt of {len(ids)} tokens needs {need} blocks of "
                f"{s.block_size} tokens but the pool has only {usable} usable blocks "
                f"(num_gpu_blocks={s.num_gpu_blocks}, block 0 is the null block)")
        if len(ids) >= self.max_model_len:
            raise ValueError(f"request {spec.id!r}: prompt of {len(ids)} tokens reaches max_model_len "
                             f"{self.max_model_len}")
        return ids

    def has_unfinished(self) -> bool:
        return bool(self._pending) or self.scheduler.has_unfinished_requests()

    # -- stepping -----------------------------------------------------------------------
    def step(self) -> snapshot.StepRecord:
        self.step_count += 1
        while self._pending and self._pending[0].arrival_step < self.step_count:
            self.add_request(self._pending.pop(0))
        out = self.scheduler.schedule()
        sampled: dict[str, int] = {}
        if out.num_scheduled_tokens:
            items = []
            for rid, n in out.num_scheduled_tokens.items():
                req = self.scheduler.requests[rid]
                before = out.num_computed_before[rid]
                items.append(SeqBatchItem(
                    request_id=rid, token_ids=req.all_token_ids[before:before + n], start_pos=before,
                    block_tables=self.kv_cache_manager.get_block_ids(rid),
                    sample=before + n >= req.num_tokens))
            sampled = self.runner.execute(items)
            if sampled:
                self.recorder.at(None).emit(events.SAMPLED, sampled_ids=list(sampled), tokens=dict(sampled))
            self.scheduler.update_from_output(out, sampled)
        elif not self.scheduler.running and self.scheduler.waiting:
            # Nothing runs and the head of the queue was refused by an empty pool: it never fits.
            head = self.scheduler.waiting.peek_request()
            self.scheduler.abort_request(head.request_id)
            self.recorder.at(head.request_id).emit(events.BLOCKED, reason="never_fits",
                               num_tokens=head.num_tokens,
                               usable_blocks=self.settings.num_gpu_blocks - 1)
        if self.debug:
            self.check_invariants()
        rec = snapshot.StepRecord(
            step=self.step_count, scheduled=dict(out.num_scheduled_tokens),
            events=tuple(self.recorder.drain()), snapshot=self.snapshot(),
            new_tokens={rid: [t] for rid, t in sampled.items()})
        self.history.append(rec)
        return rec

    def run(self, until: Optional[str] = None, max_steps: int = 100_000) -> list[snapshot.StepRecord]:
        """Step until every request finished, or until a step emits an event of kind ``until``."""
        records = []
        while self.has_unfinished() and len(records) < max_steps:
            rec = self.step()
            records.append(rec)
            if until is not None and any(e.kind == until for e in rec.events):
                break
        return records

    def generate(self, specs: list[RequestSpec]) -> dict[str, dict]:
        for spec in specs:
            self.add_request(replace(spec, arrival_step=0))
        self.run()
        return {s.id: self.outputs()[s.id] for s in specs}

    # -- reading --------------------------------------------------------------------------
    def decode(self, token_ids) -> str:
        if self.model is None or not token_ids:
            return ""
        return self.model.decode(list(token_ids))

    def snapshot(self) -> snapshot.Snapshot:
        return take_snapshot(self.scheduler, self.step_count, self.decode if self.model else None)

    def outputs(self) -> dict[str, dict]:
        out = {}
        for rid, req in self.scheduler.requests.items():
            out[rid] = {"token_ids": list(req.output_token_ids), "text": self.decode(req.output_token_ids),
                        "finish_reason": req.status.value if req.is_finished() else None}
        return out

    def check_invariants(self) -> None:
        check_invariants(self.kv_cache_manager, self.hash_fn, self.scheduler.requests)

    def reset_prefix_cache(self) -> bool:
        return self.kv_cache_manager.reset_prefix_cache()

    def evict_blocks(self, block_ids) -> None:
        self.kv_cache_manager.evict_blocks(block_ids)

    def take_kv_events(self) -> list:
        return self.kv_cache_manager.take_events()

    def bytes_per_block(self) -> int:
        from kvcore.model.memory import bytes_per_block
        return bytes_per_block(self.model.config, self.settings.block_size, self.model.dtype)
