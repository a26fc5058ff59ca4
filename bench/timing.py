"""Timing on a shared machine: every backend is a callable, and their runs are interleaved
round-robin so a burst of load from other processes hits all of them alike.

``decode_tps_interleaved`` needs ``run(prompts, max_new_tokens)`` that generates exactly
``max_new_tokens`` for each prompt; ``step_rounds`` / ``step_seconds_interleaved`` need a
``run`` that also sets ``run.step_seconds``; ``ttft`` needs ``first_token(prompt,
hit_tokens) -> seconds``.  Used by bench_engine.py and bench_dtype.py.
"""

from __future__ import annotations

import gc
import time
from typing import Callable, Sequence

RunFn = Callable[[list[list[int]], int], object]


def timed(fn: Callable[[], object]) -> float:
    gc.collect()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def timed_without_gc(fn: Callable[[], object]) -> float:
    """Seconds ``fn`` takes with the garbage collector off (collected first)."""
    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    finally:
        gc.enable()


def step_seconds_without_gc(step: Callable[[int], object], count: int) -> list[float]:
    """Seconds of each of ``step(0)`` .. ``step(count - 1)``, each timed on its own, with the
    garbage collector off (collected first).

    On a shared machine a whole pass gets preempted now and then; timing each call lets a
    benchmark keep, call by call, the best of several rounds (a preemption then costs one
    call of one round, not the round). Each time includes the call of ``step`` and one timer
    read, the same for every side compared."""
    gc.collect()
    gc.disable()
    clock = time.perf_counter
    times = [0.0] * count
    try:
        for i in range(count):
            t0 = clock()
            step(i)
            times[i] = clock() - t0
        return times
    finally:
        gc.enable()


def decode_tps_interleaved(
    cases: dict[str, tuple[RunFn, list[list[int]]]],
    new_tokens: int,
    repeat: int = 3,
    base_tokens: int = 2,
) -> dict[str, float]:
    """Decode tokens/s of each backend for its prompts: B*(N-n0) / (t(N)-t(n0)), the runs
    interleaved round-robin ``repeat`` times.

    On a shared machine a burst of load then hits every backend alike instead of
    whichever happened to be measured at that moment; the best (lowest) time is kept."""
    for run, prompts in cases.values():
        run(prompts, base_tokens)  # warm-up
    short: dict[str, list[float]] = {k: [] for k in cases}
    long: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(repeat):
        for k, (run, prompts) in cases.items():
            short[k].append(timed(lambda: run(prompts, base_tokens)))
            long[k].append(timed(lambda: run(prompts, new_tokens)))
    # under heavy load the best short run can take longer than the best long one: no figure then
    return {
        k: (
            len(prompts) * (new_tokens - base_tokens) / (min(long[k]) - min(short[k]))
            if min(long[k]) > min(short[k])
            else float("nan")
        )
        for k, (run, prompts) in cases.items()
    }


def ttft(
    first_token: Callable[[list[int], int], float],
    prompt: list[int],
    hits: Sequence[int],
    repeat: int = 3,
) -> dict[int, float]:
    """Best seconds to the first token for each prefix-hit length (in tokens)."""
    first_token(prompt, 0)  # warm-up
    return {h: min(first_token(prompt, h) for _ in range(repeat)) for h in hits}


def step_rounds(
    cases: dict[str, tuple[RunFn, list[list[int]]]], new_tokens: int, repeat: int = 3
) -> dict[str, list[float]]:
    """The median decode step (seconds) of each ``run`` that reports ``run.step_seconds``, one
    value per round: the backends' runs interleaved round-robin ``repeat`` times, so a burst
    of load from other processes hits the runs of one round alike.  Each round starts one
    backend later than the one before, so none always runs first or right after another."""
    rounds: dict[str, list[float]] = {k: [] for k in cases}
    keys = list(cases)
    for r in range(repeat):
        for k in keys[r % len(keys) :] + keys[: r % len(keys)]:
            run, prompts = cases[k]
            run(prompts, new_tokens)
            rounds[k].append(run.step_seconds)
    return rounds


def step_seconds_interleaved(
    cases: dict[str, tuple[RunFn, list[list[int]]]], new_tokens: int, repeat: int = 3
) -> dict[str, float]:
    """Best median decode step (seconds) of each backend over :func:`step_rounds`."""
    return best_steps(step_rounds(cases, new_tokens, repeat))


def best_steps(rounds: dict[str, list[float]]) -> dict[str, float]:
    """Each backend's fastest round."""
    return {k: min(v) for k, v in rounds.items()}


def paired_ratios(rounds: dict[str, list[float]], base: str, other: str) -> list[float]:
    """Per round, ``base``'s step over ``other``'s: runs minutes apart see different loads on
    a shared machine, the two runs of one round nearly the same."""
    return [b / o for b, o in zip(rounds[base], rounds[other])]
