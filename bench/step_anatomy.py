"""Where a decode step's time goes: the paged runner timed part by part, in place, and the
model's attention-free floors (with oneDNN-packed and with plain linear layers).

Used by bench_engine.py, which prints both next to the throughput figures.
"""

from __future__ import annotations

import statistics
import time

import torch

from kvcore.model import ModelRunner
from tests._mini_engine import MiniEngine


def attention_free_steps(loaded, batch: int = 8, steps: int = 15, repeat: int = 3) -> dict[str, float]:
    """Seconds of one decode forward of ``batch`` tokens with attention replaced by a no-op:
    everything in a step that is not attention (transformers' layers, the weights' matmuls,
    the LM head).  ``packed``: with the runner's oneDNN-packed linear layers (the floor of
    our runner); ``plain``: with ``nn.Linear`` (the floor of anything running the stock
    model, transformers' own continuous batching included).  Each is the median of ``steps``
    back-to-back forwards, best of ``repeat`` interleaved rounds."""
    from transformers import AttentionInterface

    from kvcore.model.reference import shared_clone
    from kvcore.model.cpu_packing import pack_linear_layers

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


def step_breakdown(loaded, prompts: list[list[int]], steps: int = 15, repeat: int = 3) -> dict[str, float]:
    """Where a decode step of the paged runner goes, timed in place (seconds per step, the
    round with the fastest median step of ``repeat``): ``step`` in all, ``linear`` (every
    linear layer, the LM head included), ``attention`` (our paged attention: K/V writes,
    block gathers, SDPA) and ``rest`` (transformers' other per-layer ops and module calls,
    the embedding, argmax, building the step's indices)."""
    from transformers import AttentionInterface

    from kvcore.worker.paged_attention import paged_attention_forward
    from kvcore.model.cpu_packing import PackedLinear

    spent = {"linear": 0.0, "attention": 0.0}

    def timed_attention(*args, **kwargs):
        t0 = time.perf_counter()
        out = paged_attention_forward(*args, **kwargs)
        spent["attention"] += time.perf_counter() - t0
        return out

    AttentionInterface.register("kvlab_bench_timed", timed_attention)
    runner = ModelRunner(loaded, 256, 16)
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
        eng = MiniEngine(runner, poison=None)
        for i, p in enumerate(prompts):
            eng.add(f"r{i}", p, steps + 3)
        eng.step()
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
            best = {"step": step, "linear": linear, "attention": attention,
                    "rest": step - linear - attention}
    return best


def stacking_gain(loaded, prompts: list[list[int]], steps: int = 40) -> dict[str, float]:
    """Median decode step (seconds) of two paged runners on the same requests, one with the
    sibling projections (q/k/v, gate/up) stacked into one packed weight each -- what
    ModelRunner does -- and one with every projection packed on its own; their steps
    alternate, so load from other processes hits both alike."""
    from functools import partial
    from unittest import mock

    import kvcore.model.cpu_packing as packing

    runners = {"stacked": ModelRunner(loaded, 256, 16)}
    unstacked = partial(packing.pack_linear_layers, stack_siblings=False)
    with mock.patch.object(packing, "pack_linear_layers", unstacked):
        runners["unstacked"] = ModelRunner(loaded, 256, 16)
    engines = {}
    for kind, runner in runners.items():
        engines[kind] = eng = MiniEngine(runner, poison=None)
        for i, p in enumerate(prompts):
            eng.add(f"r{i}", p, steps + 3)
        eng.step()
        eng.step()
    times: dict[str, list[float]] = {k: [] for k in engines}
    for _ in range(steps):
        for kind, eng in engines.items():
            t0 = time.perf_counter()
            eng.step()
            times[kind].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}
