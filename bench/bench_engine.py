"""Engine benchmark: decode throughput and time to first token of the paged engine.

Compares, on the same weights and prompts, the full :class:`record.engine.Engine` (vLLM's
scheduler and block manager, the recorder and a Snapshot every step: what the app and the
CLI run), the same requests through kvcore alone -- its KVCacheManager, Scheduler and
EngineCore over the same GPUModelRunner, under the same engine settings, with no Recorder
attached, KV cache events off and no Snapshot (``bench/step_anatomy.py: BareEngine``; "bare
kvcore" below) -- and transformers.  Engine over bare kvcore is what recording and the
Snapshots cost.  Measured:

- decode throughput (tokens/s) with 1 and 8 concurrent requests, vs ``model.generate``
  at batch 1 and with a left-padded batch of 8;
- the median decode step with 8 requests vs transformers' continuous batching
  ``model.generate_batch`` (its start-up takes seconds and varies a lot, so steps are
  compared: the gap between its consecutive decode forwards, our ``Engine.step()`` and
  ``EngineCore.step()``);
- time to first token vs prefix-hit length, bare kvcore (a first request over the prompt's
  first ``hit`` tokens leaves their blocks in the prefix cache; the timed step prefills the
  second request, the whole prompt, which feeds only its tail);
- one decode step vs the memory-bandwidth bound (all fp32 weights streamed once), and
  floors: the same model with attention a no-op, with the runner's oneDNN-packed linear
  layers and with plain ``nn.Linear`` (what the stock model, generate_batch's, runs);
- where a decode step of 8 requests goes (linear layers, paged attention, the rest), and what
  stacking q/k/v and gate/up into one packed weight each gains, step against step
  (``bench/step_anatomy.py``).

Every measurement (``bench/timing.py``) takes the backends as callables: ``run(prompts,
max_new_tokens)`` generates exactly ``max_new_tokens`` for each prompt and may set
``run.step_seconds``; ``first_token(prompt, hit_tokens)`` returns seconds.

Decode throughput is measured as ``B * (N - n0) / (t(N) - t(n0))`` -- the prefill and
first token cancel out, so backends that cannot time their steps separately (generate)
are measured like the others.  Runs are interleaved round-robin and the best of
``--repeat`` kept, since the machine may be shared.

    python bench/bench_engine.py               # SmolLM2 when installed, else tiny-random
    python bench/bench_engine.py --quick       # fewer tokens and repeats
    python bench/bench_engine.py --quick --model tiny-random   # a minute: does it still run?
    python bench/bench_engine.py --repeat 5    # steadier figures on a busy machine
    python bench/bench_engine.py --threads 1   # on a machine shared with other jobs

Figures: docs/results.md, *Engine speed* (they move by +-20% between runs on the project's
shared 2-core machine).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from bench.step_anatomy import (  # noqa: E402
    BareEngine,
    attention_free_steps,
    bare_engine,
    bench_settings,
    stacking_gain,
    step_breakdown,
)
from bench.timing import (  # noqa: E402
    best_steps,
    decode_tps_interleaved,
    paired_ratios,
    step_rounds,
    timed,
    ttft,
)
from kvcore.model import ATTENTION_MODELS, load_model, smollm2_available  # noqa: E402
from kvcore.worker.gpu.model_runner import GPUModelRunner  # noqa: E402

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Name three prime numbers.",
    "Why is the sky blue?",
    "Give me a tip for learning Python.",
    "What does a KV cache store?",
    "Describe a cat in one sentence.",
    "How many legs does a spider have?",
]


# --------------------------------------------------------------------- the bound
def weight_bandwidth_bound(model) -> tuple[float, float, float]:
    """(weight bytes, measured GB/s of a streaming read, seconds to stream all weights once)."""
    nbytes = sum(
        p.numel() * p.element_size() for p in model.parameters()
    )  # tied weights counted once
    big = torch.ones(64 * 1024 * 1024 // 4 * 4)  # 64 MiB
    big.sum()
    t = min(timed(lambda: big.sum()) for _ in range(5))
    gbs = big.numel() * 4 / t / 1e9
    return nbytes, gbs, nbytes / (gbs * 1e9)


# --------------------------------------------------------------------- backends
def paged_runner_backend(loaded, block_size: int = 16, num_blocks: int | None = None):
    """run(prompts, n) through bare kvcore (:class:`bench.step_anatomy.BareEngine`: KVCacheManager,
    Scheduler and EngineCore, no Recorder, no Snapshot) over one GPUModelRunner, allocated once;
    each call builds fresh kvcore bookkeeping over it (an empty prefix cache) under the same
    settings as :func:`engine_backend`.  ``run`` returns each request's token ids;
    ``run.step_seconds``: the median decode step of the last call (steps where every scheduled
    request feeds one token).  ``first_token(prompt, hit)``: seconds of the step that prefills
    ``prompt`` with its first ``hit`` tokens (a multiple of the block size) already cached."""
    num_blocks = num_blocks or 256
    runner = GPUModelRunner(loaded, num_blocks, block_size)

    def run(prompts, n):
        eng = bare_engine(runner, prompts, n)
        decode_steps = []
        while eng.has_unfinished():
            t0 = time.perf_counter()
            done = eng.step()
            dt = time.perf_counter() - t0
            scheduled = done.scheduler_output.num_scheduled_tokens
            if scheduled and all(v == 1 for v in scheduled.values()):
                decode_steps.append(dt)
        outs = eng.outputs()
        if any(len(o) != n for o in outs.values()):
            raise RuntimeError("bare kvcore did not generate exactly n tokens per request")
        run.step_seconds = statistics.median(decode_steps) if decode_steps else float("nan")
        return outs

    run.step_seconds = float("nan")

    def first_token(prompt, hit):
        if hit % block_size or hit >= len(prompt):
            raise ValueError("a prefix hit is whole blocks, short of the prompt")
        eng = BareEngine(runner, bench_settings([prompt], block_size, num_blocks))
        if hit:
            eng.add("warm", prompt[:hit], 1)
            eng.run()  # finished: its full blocks stay in the prefix cache, holding the KV
        eng.add("b", prompt, 1)
        out = []
        seconds = timed(lambda: out.append(eng.step()))
        fed = out[0].scheduler_output.num_scheduled_tokens.get("b")
        if fed != len(prompt) - hit:
            raise RuntimeError(
                f"expected a prefix hit of {hit} tokens; the step fed {fed} of {len(prompt)}"
            )
        return seconds

    return run, first_token, runner


def engine_backend(loaded, block_size: int = 16, num_blocks: int = 256):
    """run(prompts, n) through the full :class:`record.engine.Engine`: vLLM's scheduler and
    block manager (prefix caching on), the recorder, a Snapshot and detokenised text every
    step -- what the app and the CLI run.  ``run.step_seconds``: the median decode step of
    the last call (steps where every scheduled request feeds one token)."""
    from paged_kv_lab.run.engine import Engine
    from paged_kv_lab.run.scenario import RequestSpec, Scenario

    def run(prompts, n):
        scenario = Scenario(
            model=loaded.name,
            device=str(loaded.device.type),
            engine=bench_settings(prompts, block_size, num_blocks),
            requests=tuple(
                RequestSpec(id=f"r{i}", prompt_token_ids=tuple(p), max_tokens=n, ignore_eos=True)
                for i, p in enumerate(prompts)
            ),
        )
        eng = Engine(scenario, model=loaded)
        decode_steps = []
        while eng.has_unfinished():
            t0 = time.perf_counter()
            rec = eng.step()
            dt = time.perf_counter() - t0
            if rec.scheduled and all(v == 1 for v in rec.scheduled.values()):
                decode_steps.append(dt)
        outs = eng.outputs()
        if any(len(o["token_ids"]) != n for o in outs.values()):
            raise RuntimeError("the engine did not generate exactly n tokens per request")
        run.step_seconds = statistics.median(decode_steps) if decode_steps else float("nan")
        return outs

    run.step_seconds = float("nan")
    return run


def hf_generate_backend(loaded):
    """run(prompts, n) with ``model.generate`` (left-padded batch when several prompts)."""
    model = loaded.model
    pad = (
        loaded.tokenizer.pad_token_id
        if getattr(loaded.tokenizer, "pad_token_id", None) is not None
        else 0
    )

    def run(prompts, n):
        L = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), L), pad, dtype=torch.long)
        mask = torch.zeros((len(prompts), L), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, L - len(p) :] = torch.tensor(p)
            mask[i, L - len(p) :] = 1
        with torch.inference_mode():
            return model.generate(
                ids.to(loaded.device),
                attention_mask=mask.to(loaded.device),
                do_sample=False,
                max_new_tokens=n,
                min_new_tokens=n,
                pad_token_id=pad,
            )

    def first_token(prompt, hit):
        return timed(lambda: run([prompt], 1))

    return run, first_token


def hf_generate_batch_backend(loaded):
    """run(prompts, n) with transformers' continuous batching ``generate_batch`` (or None).

    Its start-up (allocating a paged cache sized from free memory, worker thread) takes
    seconds and varies a lot from run to run, so t(N) - t(n0) is unreliable for it.  The
    returned ``run`` therefore records when each forward starts (a forward pre-hook); its
    attribute ``step_seconds`` is the median gap between consecutive decode forwards of the
    last call, and decode tokens/s = B / step_seconds."""
    from transformers import GenerationConfig

    model = loaded.model
    if not hasattr(model, "generate_batch"):
        return None
    starts: list[float] = []

    def pre_hook(module, args, kwargs):
        starts.append(time.perf_counter())

    def run(prompts, n):
        gcfg = GenerationConfig(max_new_tokens=n, do_sample=False, eos_token_id=-1, pad_token_id=0)
        starts.clear()
        handle = model.register_forward_pre_hook(pre_hook, with_kwargs=True)
        try:
            out = model.generate_batch(inputs=prompts, generation_config=gcfg, progress_bar=False)
        finally:
            handle.remove()
        lens = [len(o.generated_tokens) for o in out.values()]
        if lens != [n] * len(prompts):
            raise RuntimeError(f"generate_batch returned {lens} tokens")
        gaps = [b - a for a, b in zip(starts[1:], starts[2:])]  # decode forwards only
        run.step_seconds = statistics.median(gaps) if gaps else float("nan")
        return out

    run.step_seconds = float("nan")
    return run


# --------------------------------------------------------------------- main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="fewer tokens and repeats")
    ap.add_argument("--model", choices=ATTENTION_MODELS, default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument(
        "--no-generate-batch", action="store_true", help="skip transformers' generate_batch"
    )
    ap.add_argument(
        "--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)"
    )
    ap.add_argument("--repeat", type=int, default=None, help="runs per measurement (best kept)")
    ap.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="rounds of the generate_batch comparison (default: --repeat)",
    )
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    name = args.model or ("smollm2" if smollm2_available() else "tiny-random")
    loaded = load_model(name, args.device)
    torch.set_grad_enabled(False)
    new_tokens = 12 if args.quick else 32
    repeat = args.repeat or (2 if args.quick else 3)
    load0 = os.getloadavg()[0]
    prompts8 = [loaded.encode_prompt(q) for q in QUESTIONS]
    prompt1 = [prompts8[0]]

    print(
        f"# Paged KV Lab engine benchmark ({loaded.name}, {loaded.device}, {loaded.dtype}, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads)"
    )
    print(
        f"prompts: {len(prompts8)} chat prompts of "
        f"{min(map(len, prompts8))}-{max(map(len, prompts8))} "
        f"tokens; {new_tokens} new tokens; best of {repeat}\n"
    )

    paged_run, paged_first, runner = paged_runner_backend(loaded)
    engine_run = engine_backend(loaded)
    gen_run, gen_first = hf_generate_backend(loaded)

    cases = {
        "paged1": (paged_run, prompt1),
        "engine1": (engine_run, prompt1),
        "gen1": (gen_run, prompt1),
        "paged8": (paged_run, prompts8),
        "engine8": (engine_run, prompts8),
        "gen8": (gen_run, prompts8),
    }
    res = decode_tps_interleaved(cases, new_tokens, repeat)
    bare = "bare kvcore (scheduler, block manager; no Recorder, no Snapshot)"
    rows: list[tuple[str, str, float]] = [
        (bare, "1", res["paged1"]),
        ("Engine (scheduler, block manager, Recorder, Snapshot)", "1", res["engine1"]),
        ("transformers generate", "1", res["gen1"]),
        (bare, "8 concurrent", res["paged8"]),
        ("Engine (scheduler, block manager, Recorder, Snapshot)", "8 concurrent", res["engine8"]),
        ("transformers generate (left-padded)", "8", res["gen8"]),
    ]
    print("## Decode throughput\n")
    print("| backend | requests | decode tokens/s | vs generate batch 1 |")
    print("|---|---|---:|---:|")
    for who, n, tps in rows:
        print(f"| {who} | {n} | {tps:.1f} | {tps / res['gen1']:.2f}x |")
    print()
    print(
        "Targets (CPU): batch 1 >= 1.0x generate: bare "
        f"{res['paged1'] / res['gen1']:.2f}x, Engine {res['engine1'] / res['gen1']:.2f}x; "
        f"8 concurrent >= 5x generate batch 1: bare {res['paged8'] / res['gen1']:.2f}x, "
        f"Engine {res['engine8'] / res['gen1']:.2f}x"
    )
    print(
        "What recording and the Snapshots cost (Engine's decode time per token over bare "
        f"kvcore's): 1 request {res['paged1'] / res['engine1']:.2f}x, "
        f"8 concurrent {res['paged8'] / res['engine8']:.2f}x"
    )

    steps: dict[str, float] = {}
    gb = None if args.no_generate_batch else hf_generate_batch_backend(loaded)
    if gb is not None:
        try:
            rounds = step_rounds(
                {
                    "gb8": (gb, prompts8),
                    "engine8": (engine_run, prompts8),
                    "paged8": (paged_run, prompts8),
                },
                min(new_tokens, 16),
                args.rounds or repeat,
            )
            steps = best_steps(rounds)
        except Exception as exc:  # pragma: no cover - depends on the transformers build
            print(f"(generate_batch did not run: {type(exc).__name__}: {exc})")
    if steps:
        print("\n## Against transformers' continuous batching (`generate_batch`), same 8 prompts\n")
        print(f"Median decode step, runs interleaved, best of {args.rounds or repeat}:\n")
        print("| backend | decode step ms | decode tokens/s | generate_batch step / this step |")
        print("|---|---:|---:|---:|")
        for k, who in (
            ("gb8", "transformers generate_batch"),
            ("engine8", "Engine"),
            ("paged8", "bare kvcore"),
        ):
            print(
                f"| {who} | {steps[k] * 1e3:.1f} | {8 / steps[k]:.1f} | "
                f"{steps['gb8'] / steps[k]:.2f}x |"
            )
        print(
            f"\nTarget (CPU): >= 2x generate_batch: Engine {steps['gb8'] / steps['engine8']:.2f}x, "
            f"bare kvcore {steps['gb8'] / steps['paged8']:.2f}x (best against best)"
        )
        for k, who in (("engine8", "Engine"), ("paged8", "bare kvcore")):
            r = paired_ratios(rounds, "gb8", k)
            print(
                f"Paired, round by round: {who} {', '.join(f'{x:.2f}x' for x in r)}; "
                f"median {statistics.median(r):.2f}x"
            )
        r = paired_ratios(rounds, "engine8", "paged8")
        print(
            f"Engine step / bare kvcore step (recording + Snapshot), round by round: "
            f"{', '.join(f'{x:.2f}x' for x in r)}; median {statistics.median(r):.2f}x"
        )

    # one decode step vs the bandwidth bound
    nbytes, gbs, bound = weight_bandwidth_bound(loaded.model)
    step1 = 1.0 / res["paged1"]
    step8 = 8.0 / res["paged8"]
    print("\n## One decode step vs the memory-bandwidth bound\n")
    print("| | ms |")
    print("|---|---:|")
    print(
        f"| weights {nbytes / 1e6:.0f} MB at measured {gbs:.1f} GB/s (bound) | {bound * 1e3:.1f} |"
    )
    print(f"| weights at a nominal 35 GB/s | {nbytes / 35e9 * 1e3:.1f} |")
    for n, step in ((1, step1), (8, step8)):
        print(
            f"| bare kvcore decode step, {n} request{'s' if n > 1 else ''} | {step * 1e3:.1f} "
            f"({step / bound:.1f}x the bound) |"
        )
    floors = attention_free_steps(loaded, 8, repeat=repeat)
    floor_packed, floor_plain = floors["packed"], floors["plain"]
    print(
        f"| the model with attention a no-op, 8 tokens, oneDNN-packed linears (our runner's floor) "
        f"| {floor_packed * 1e3:.1f} |"
    )
    print(
        f"| the same with plain nn.Linear (the floor of the stock model, generate_batch's) "
        f"| {floor_plain * 1e3:.1f} |"
    )
    parts = step_breakdown(loaded, prompts8, repeat=repeat)
    print("\n## Where a decode step of 8 requests goes (bare kvcore, timed in place)\n")
    print("| part | ms |")
    print("|---|---:|")
    for k, what in (
        ("linear", "linear layers + LM head (oneDNN-packed)"),
        ("attention", "paged attention (K/V writes, block gathers, SDPA)"),
        (
            "rest",
            "everything else: transformers' norms, RoPE, residuals, activation, "
            "module calls; embedding; argmax; the step's indices; "
            "kvcore's scheduling and block bookkeeping",
        ),
        ("step", "the step"),
    ):
        print(f"| {what} | {parts[k] * 1e3:.1f} |")
    for n in (8, 1):
        gain = stacking_gain(loaded, prompts8[:n])
        print(
            f"\nDecode step with {n} request(s), steps alternating: q/k/v and gate/up stacked "
            f"{gain['stacked'] * 1e3:.1f} ms, each packed on its own "
            f"{gain['unstacked'] * 1e3:.1f} ms "
            f"({gain['unstacked'] / gain['stacked']:.2f}x)"
        )

    # time to first token vs prefix-hit length
    long_prompt = []
    for p in prompts8:
        long_prompt += p
    L = 128 if args.quick else 256
    long_prompt = (long_prompt * 4)[:L]
    bs = runner.block_size
    full = (L - 1) // bs * bs
    hits = sorted({0, full // 4 // bs * bs, full // 2 // bs * bs, 3 * full // 4 // bs * bs, full})
    t_paged = ttft(paged_first, long_prompt, hits, repeat)
    t_gen = min(gen_first(long_prompt, 0) for _ in range(repeat))
    print(f"\n## Time to first token vs prefix-hit length (prompt {L} tokens, block size {bs})\n")
    print("| prefix hit (tokens) | tokens computed | paged TTFT ms | generate TTFT ms (no reuse) |")
    print("|---:|---:|---:|---:|")
    for h in hits:
        print(f"| {h} | {L - h} | {t_paged[h] * 1e3:.1f} | {t_gen * 1e3:.1f} |")
    print(
        f"\n(load average {load0:.1f} at start, {os.getloadavg()[0]:.1f} at the end, on "
        f"{os.cpu_count()} CPUs: other processes on the machine inflate every figure)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
