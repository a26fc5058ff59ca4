"""Real engine runs that, between them, make every kind of decision (tests take their events
from here instead of building events by hand)."""

from __future__ import annotations

import functools

from paged_kv_lab.run.engine import NoModelRunner
from paged_kv_lab.run.scenario import CPUOffloadConfig, SpeculativeConfig
from support.kv import make_engine, spec, table


@functools.cache
def every_kind_runs() -> tuple[tuple[str, tuple], ...]:
    """(name, StepRecords) of a few small runs on the block manager (no model, milliseconds)."""
    runs = []
    # A pool too small for two requests: preemption, eviction, a resumption that finds its own
    # blocks again; reset_prefix_cache refused while blocks are in use, then accepted; a block
    # evicted by id; a request whose prompt hits blocks another one holds.
    eng = make_engine(
        [spec("A", range(8), max_tokens=6), spec("B", range(20, 28), max_tokens=6)],
        num_gpu_blocks=6,
    )
    recs = [eng.step()]
    eng.reset_prefix_cache()  # refused: A and B hold blocks
    recs += eng.run()
    eng.reset_prefix_cache()  # accepted: nothing is in use
    eng.add_request(spec("C", range(40, 49), max_tokens=3))
    recs.append(eng.step())
    eng.evict_blocks([table(eng, "C")[0]])
    eng.add_request(spec("D", range(40, 49), max_tokens=2))
    recs += eng.run()
    runs.append(("preemption", tuple(recs)))
    # Full + sliding-window groups, chunked prefill under a small budget: window skips, chunks
    # beside decodes, requests blocked by the budget, hits in both groups.
    eng = make_engine(
        [
            spec("A", range(8), max_tokens=6),
            spec("B", range(20, 28), max_tokens=6),
            spec("C", list(range(8)) + [99], max_tokens=2, arrival_step=3),
        ],
        block_size=2,
        num_gpu_blocks=16,
        max_num_batched_tokens=12,
        sliding_window=4,
        layer_types=("full_attention", "sliding_attention"),
    )
    runs.append(("hybrid", tuple(eng.run())))
    # Speculative decoding: a 5-token vocabulary makes the stand-in model cycle downwards while
    # the prompt climbs, so the n-gram proposer's first drafts (from the prompt) are rejected and
    # its later ones (from the model's own cycle) accepted.
    eng = make_engine(
        [spec("S", [0, 1, 2, 3, 4] * 2, max_tokens=14)],
        runner=NoModelRunner(vocab_size=5),
        block_size=4,
        num_gpu_blocks=12,
        speculative=SpeculativeConfig(
            num_speculative_tokens=3, prompt_lookup_min=1, prompt_lookup_max=2
        ),
    )
    runs.append(("spec_decode", tuple(eng.run())))
    # The CPU tier: A's blocks stored to a 7-block CPU pool and evicted from the GPU by B; C finds
    # them on the CPU and loads them back; D's own stores then evict the CPU's oldest blocks.
    eng = make_engine(
        [
            spec("A", range(16), max_tokens=3),
            spec("B", range(100, 108), max_tokens=3, arrival_step=4),
            spec("C", [*range(16), 99], max_tokens=2, arrival_step=8),
            spec("D", range(200, 216), max_tokens=2, arrival_step=12),
        ],
        block_size=4,
        num_gpu_blocks=7,
        cpu_offload=CPUOffloadConfig(num_cpu_blocks=7),
    )
    runs.append(("cpu_offload", tuple(eng.run())))
    # A failed load: C's copy from the CPU fails, C is cut back to its GPU hit and recomputes.
    eng = make_engine(
        [
            spec("A", range(16), max_tokens=3),
            spec("B", range(100, 116), max_tokens=3, arrival_step=4),
            spec("C", range(16), max_tokens=3, arrival_step=8),
        ],
        block_size=4,
        num_gpu_blocks=7,
        cpu_offload=CPUOffloadConfig(
            num_cpu_blocks=12, fail_loads=("C",), kv_load_failure_policy="recompute"
        ),
    )
    runs.append(("kv_load_failed", tuple(eng.run())))
    # A hybrid layout (3 state groups, 1 attention group) with prefix_match_unit 2 inside 8-token
    # blocks: A's prompt ends inside its second block, which is cached there; A keeps writing it,
    # so the cached states move to copies; B and C hit 12 tokens, inside that block, and get
    # private copies (copy-on-write); a full block outgrows its partial entry.
    eng = make_engine(
        [
            spec("A", range(100, 113), max_tokens=4),
            spec("B", [*range(100, 113), 5, 6, 7], max_tokens=4, arrival_step=3),
            spec("C", [*range(100, 112), 99, 98], max_tokens=4, arrival_step=3),
        ],
        block_size=8,
        num_gpu_blocks=40,
        prefix_match_unit=2,
        layer_types=("linear_attention",) * 3 + ("full_attention",),
    )
    runs.append(("partial_hits", tuple(eng.run())))
    # vLLM 0.34's cache-aware admission: "long" keeps the pool over half used, "warm0" caches a
    # prefix; "cold" then arrives just before "warm" (that prefix and more), and the window of 2
    # lets "warm" go ahead of it.
    prefix = list(range(100, 108))
    eng = make_engine(
        [
            spec("long", list(range(24)), max_tokens=30),
            spec("warm0", [*prefix, 1, 2], max_tokens=1),
            spec("cold", list(range(200, 210)), max_tokens=2, arrival_step=3),
            spec("warm", [*prefix, 7, 8], max_tokens=2, arrival_step=3),
        ],
        num_gpu_blocks=12,
        max_num_seqs=2,
        cache_aware_admission_window=2,
    )
    runs.append(("cache_aware", tuple(eng.run())))
    return tuple(runs)


def every_kind_events() -> list:
    return [e for _, recs in every_kind_runs() for r in recs for e in r.events]
