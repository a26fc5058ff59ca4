"""Where a decode step's time goes: the paged runner timed part by part, in place, and the
model's attention-free floors (with oneDNN-packed and with plain linear layers).

The runner is driven by :class:`BareEngine`: kvcore alone -- its KVCacheManager, Scheduler and
EngineCore over a GPUModelRunner, built from EngineSettings as ``record.engine.Engine`` builds
them, but with no Recorder attached, KV cache events off, no Snapshot and no detokenising.
bench_engine.py uses it too, as its bare side, and prints these parts next to the throughput
figures:

    .venv/bin/python bench/bench_engine.py --quick --model tiny-random
"""

from __future__ import annotations

import statistics
import time
from typing import Iterable, Sequence

import torch

from kvcore.core.sched.scheduler import Scheduler
from kvcore.engine.core import EngineCore, EngineCoreStep
from kvcore.request import Request
from kvcore.worker.gpu.model_runner import GPUModelRunner
from paged_kv_lab.run.engine import (
    block_hasher_for,
    kv_cache_groups,
    kv_cache_manager_for,
    scheduler_config_for,
)
from paged_kv_lab.run.scenario import EngineSettings


def bench_settings(
    prompts: Sequence[Sequence[int]], block_size: int = 16, num_blocks: int = 256, **kw
) -> EngineSettings:
    """The engine settings both sides of bench_engine.py run under: every prompt admitted
    and prefilled in the first step, prefix caching on (EngineSettings' defaults otherwise)."""
    return EngineSettings(
        block_size=block_size,
        num_gpu_blocks=num_blocks,
        max_num_seqs=max(1, len(prompts)),
        max_num_batched_tokens=max(256, sum(map(len, prompts))),
        **kw,
    )


class BareEngine:
    """vLLM's step loop and nothing around it: kvcore's KVCacheManager, Scheduler and EngineCore
    over an existing GPUModelRunner (its pool is reused; only the bookkeeping is new).

    Built from ``settings`` as ``record.engine.Engine`` builds them (same KV cache groups,
    hashing, scheduler config), but the pool's observer stays None (no Recorder attached, so no
    block hook and no decision is recorded and nothing is wrapped), KV cache events are off (as
    in vLLM by default), and a step is just ``EngineCore.step()``: no Snapshot, no text, no
    invariant checks. The runner must have been built with the settings' block size and
    ``num_gpu_blocks`` blocks, one full-attention group (no sliding window, no drafts)."""

    def __init__(self, runner: GPUModelRunner, settings: EngineSettings) -> None:
        s = settings
        if (runner.block_size, runner.num_blocks) != (s.block_size, s.num_gpu_blocks):
            raise ValueError(
                "the runner's pool does not match the settings' block_size / num_gpu_blocks"
            )
        cfg = runner.loaded.config
        self.max_model_len = s.max_model_len or getattr(cfg, "max_position_embeddings", 8192)
        groups, _ = kv_cache_groups(s, runner.num_layers)
        # KV cache events off (vLLM's default) and no recorder: kvcore alone
        self.kv_cache_manager = kv_cache_manager_for(
            s, groups, self.max_model_len, enable_kv_cache_events=False
        )
        self.scheduler = Scheduler(
            scheduler_config_for(s, self.max_model_len), self.kv_cache_manager
        )
        self.engine_core = EngineCore(self.scheduler, runner, None, self.max_model_len)
        self.hasher = block_hasher_for(s) if s.enable_prefix_caching else None
        self.requests: dict[str, Request] = {}

    def add(
        self,
        rid: str,
        prompt: Sequence[int],
        max_tokens: int,
        eos_ids: Iterable[int] = (),
        ignore_eos: bool = True,
    ) -> None:
        """Queue a request (default: exactly ``max_tokens`` tokens, EOS ignored)."""
        req = Request(
            rid,
            list(prompt),
            max_tokens,
            arrival_time=len(self.requests) + 1,
            eos_token_ids=eos_ids,
            ignore_eos=ignore_eos,
            block_hasher=self.hasher,
        )
        self.requests[rid] = req
        self.scheduler.add_request(req)

    def step(self) -> EngineCoreStep:
        return self.engine_core.step()

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def run(self, max_steps: int = 100_000) -> dict[str, list[int]]:
        for _ in range(max_steps):
            if not self.has_unfinished():
                break
            self.step()
        return self.outputs()

    def outputs(self) -> dict[str, list[int]]:
        return {rid: list(r.output_token_ids) for rid, r in self.requests.items()}


def bare_engine(
    runner: GPUModelRunner, prompts: Sequence[Sequence[int]], max_tokens: int
) -> BareEngine:
    """A BareEngine over ``runner`` with ``prompts`` queued as r0, r1, ... (``max_tokens`` each)."""
    eng = BareEngine(runner, bench_settings(prompts, runner.block_size, runner.num_blocks))
    for i, p in enumerate(prompts):
        eng.add(f"r{i}", p, max_tokens)
    return eng


def attention_free_steps(
    loaded, batch: int = 8, steps: int = 15, repeat: int = 3
) -> dict[str, float]:
    """Seconds of one decode forward of ``batch`` tokens with attention replaced by a no-op:
    everything in a step that is not attention (transformers' layers, the weights' matmuls,
    the LM head).  ``packed``: with the runner's oneDNN-packed linear layers (the floor of
    our runner); ``plain``: with ``nn.Linear`` (the floor of anything running the stock
    model, transformers' own continuous batching included).  Each is the median of ``steps``
    back-to-back forwards, best of ``repeat`` interleaved rounds."""
    from transformers import AttentionInterface

    from kvcore.model.cpu_packing import pack_linear_layers
    from kvcore.model.reference import shared_clone

    def no_attention(module, query, key, value, attention_mask, **kwargs):
        return query.transpose(1, 2), None

    AttentionInterface.register("kvlab_bench_no_attention", no_attention)
    models = {}
    for kind in ("packed", "plain"):
        model = shared_clone(loaded.model)
        model.set_attn_implementation("kvlab_bench_no_attention")
        if kind == "packed":
            pack_linear_layers(model)
        models[kind] = model
    dev = loaded.device
    ids = torch.full((1, batch), 100, dtype=torch.long, device=dev)
    pos = torch.arange(40, 40 + batch, device=dev)[None]
    keep = torch.arange(batch, device=dev)
    best = {k: float("inf") for k in models}
    with torch.inference_mode():
        for _ in range(repeat):
            for kind, model in models.items():
                for _ in range(2):
                    model(input_ids=ids, position_ids=pos, use_cache=False, logits_to_keep=keep)
                times = []
                for _ in range(steps):
                    t0 = time.perf_counter()
                    model(input_ids=ids, position_ids=pos, use_cache=False, logits_to_keep=keep)
                    times.append(time.perf_counter() - t0)
                best[kind] = min(best[kind], statistics.median(times))
    return best


def step_breakdown(
    loaded, prompts: list[list[int]], steps: int = 15, repeat: int = 3
) -> dict[str, float]:
    """Where a decode step of the paged runner goes, timed in place (seconds per step, the
    round with the fastest median step of ``repeat``): ``step`` in all (one
    ``EngineCore.step()`` of a :class:`BareEngine`), ``linear`` (every linear layer, the LM
    head included), ``attention`` (our paged attention: K/V writes, block gathers, SDPA) and
    ``rest`` (transformers' other per-layer ops and module calls, the embedding, argmax,
    building the step's indices, and kvcore's bookkeeping: scheduling, the block manager,
    ``update_from_output``)."""
    from transformers import AttentionInterface

    from kvcore.model.cpu_packing import PackedLinear
    from kvcore.worker.paged_attention import paged_attention_forward

    spent = {"linear": 0.0, "attention": 0.0}

    def timed_attention(*args, **kwargs):
        t0 = time.perf_counter()
        out = paged_attention_forward(*args, **kwargs)
        spent["attention"] += time.perf_counter() - t0
        return out

    AttentionInterface.register("kvlab_bench_timed", timed_attention)
    runner = GPUModelRunner(loaded, 256, 16)
    runner.model.set_attn_implementation("kvlab_bench_timed")
    for module in runner.model.modules():
        if isinstance(module, (PackedLinear, torch.nn.Linear)):

            def timed_linear(x, _forward=module.forward):
                t0 = time.perf_counter()
                out = _forward(x)
                spent["linear"] += time.perf_counter() - t0
                return out

            module.forward = timed_linear
    best: dict[str, float] = {"step": float("inf")}
    for _ in range(repeat):
        eng = bare_engine(runner, prompts, steps + 3)
        eng.step()  # the prefill
        eng.step()
        rows = []
        for _ in range(steps):
            spent["linear"] = spent["attention"] = 0.0
            t0 = time.perf_counter()
            eng.step()
            rows.append((time.perf_counter() - t0, spent["linear"], spent["attention"]))
        rows.sort()
        step, linear, attention = rows[len(rows) // 2]
        if step < best["step"]:
            best = {
                "step": step,
                "linear": linear,
                "attention": attention,
                "rest": step - linear - attention,
            }
    return best


def stacking_gain(loaded, prompts: list[list[int]], steps: int = 40) -> dict[str, float]:
    """Median decode step (seconds, one :class:`BareEngine` step) of two paged runners on the
    same requests, one with the sibling projections (q/k/v, gate/up) stacked into one packed
    weight each -- what GPUModelRunner does -- and one with every projection packed on its
    own; their steps alternate, so load from other processes hits both alike."""
    from functools import partial
    from unittest import mock

    import kvcore.model.cpu_packing as packing

    runners = {"stacked": GPUModelRunner(loaded, 256, 16)}
    unstacked = partial(packing.pack_linear_layers, stack_siblings=False)
    with mock.patch.object(packing, "pack_linear_layers", unstacked):
        runners["unstacked"] = GPUModelRunner(loaded, 256, 16)
    engines = {}
    for kind, runner in runners.items():
        engines[kind] = eng = bare_engine(runner, prompts, steps + 3)
        eng.step()  # the prefill
        eng.step()
    times: dict[str, list[float]] = {k: [] for k in engines}
    for _ in range(steps):
        for kind, eng in engines.items():
            t0 = time.perf_counter()
            eng.step()
            times[kind].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}
