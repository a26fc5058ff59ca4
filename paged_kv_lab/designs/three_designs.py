"""One trace through three cache designs with the same KV memory: ``python -m paged_kv_lab
compare``.

The inputs are the same for every design: the trace's requests and their tokens
(paged_kv_lab.workloads.tokens), the arrival rule, the engine settings, and the KV memory in tokens,
``num_gpu_blocks * block_size``. vLLM is the replay itself (workload.replay, our kvcore);
nano-vllm gets ``num_gpu_blocks`` blocks of ``block_size``; SGLang gets a pool of that many token
slots in pages of ``page_size`` (default ``block_size``).

nano-vllm runs at commit ``nano_commit`` (bb823b3, its main today, unless it says 2f352ae).

SGLang and nano-vllm run one request at a time (paged_kv_lab.designs.sim), which is the replay's
``sequential`` rule; under ``timestamps`` their batch schedulers would decide who runs beside
whom, and those schedulers are not modelled here, so ``compare`` asks for sequential arrival.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from paged_kv_lab.designs.nanovllm import COMMITS, HEAD, check_commit
from paged_kv_lab.designs.sim import DesignError, DesignRequest, NanoRun, SGLangRun
from paged_kv_lab.run.driver import run_to_end
from paged_kv_lab.text.i18n import Refusal
from paged_kv_lab.workloads.replay import ReplaySettings, replay
from paged_kv_lab.workloads.tokens import prompt_token_ids
from paged_kv_lab.workloads.trace_formats import Trace

DESIGNS = ("vllm", "sglang", "nano")
# vLLM's design is kvcore's replay at the settings it is given (block size, free order, admission)
# and the scheduler's defaults, where vLLM 0.34.0 schedules as 0.33.0 did (cache-aware admission
# off, no cap on in-flight loads), so its figures are 0.34.0's; a hybrid model's block size, when
# not set, is resolved as 0.34.0 resolves it on a GPU (kvcore/model/memory.py).
NAMES = {"vllm": "vLLM 0.34.0", "sglang": "SGLang 0.5.23", "nano": f"nano-vllm {HEAD}"}


def design_name(design: str, nano_commit: str = HEAD) -> str:
    """The design's name with the version modelled (nano-vllm's commit)."""
    return f"nano-vllm {nano_commit}" if design == "nano" else NAMES[design]


def parse_nano_commit(text: str) -> str:
    try:
        return check_commit(text)
    except ValueError:
        raise CompareError("nano_commit", commit=repr(text), known=" / ".join(COMMITS)) from None


class CompareError(Refusal):
    """Inputs compare cannot run: the catalogue sentence "problem.compare.<key>"."""

    PREFIX = "problem.compare."


def parse_designs(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    bad = [n for n in names if n not in DESIGNS]
    if bad or not names:
        if not names:
            raise CompareError("designs_none", known=",".join(DESIGNS))
        raise CompareError("designs_unknown", bad=", ".join(bad), known=",".join(DESIGNS))
    return tuple(dict.fromkeys(names))


@dataclass(frozen=True)
class DesignResult:
    """A design's figures, named as the replay's (``per_request`` in trace order)."""

    design: str
    requests: int
    prompt_tokens: int
    queries: int
    hit_tokens: int
    evictions: int
    evicted_tokens: int
    preemptions: int
    steps: int
    wall_s: float
    per_request: tuple

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queries if self.queries else 0.0

    nano_commit: str = HEAD

    def to_dict(self) -> dict:
        d = asdict(self)
        d["hit_rate"] = self.hit_rate
        d["name"] = design_name(self.design, self.nano_commit)
        d["per_request"] = [asdict(r) if not isinstance(r, dict) else r for r in self.per_request]
        return d


def trace_requests(trace: Trace) -> list[DesignRequest]:
    return [
        DesignRequest(r.request_id, tuple(prompt_token_ids(r, trace.block_size)), r.output_length)
        for r in trace.requests
    ]


def _finish(
    design: str, run, trace: Trace, t0: float, evictions: int, evicted_tokens: int, **extra
):
    per = []
    arrival = {r.request_id: r.arrival_ms for r in trace.requests}
    for r in run.results:
        d = asdict(r)
        d["arrival_ms"] = arrival[r.request_id]
        per.append(d)
    prompt = sum(r.prompt_tokens for r in run.results)
    return DesignResult(
        design=design,
        requests=len(run.results),
        prompt_tokens=prompt,
        queries=prompt,
        hit_tokens=sum(r.hit_tokens for r in run.results),
        evictions=evictions,
        evicted_tokens=evicted_tokens,
        preemptions=0,
        steps=run.steps,
        wall_s=time.perf_counter() - t0,
        per_request=tuple(per),
        **extra,
    )


def _drive(run, requests: list[DesignRequest]) -> None:
    """The requests, one after another (the sequential rule), through a design's driver."""
    for req in requests:
        run.add_request(req)
    run_to_end(run, len(requests))


def run_design(
    design: str,
    trace: Trace,
    settings: ReplaySettings,
    page_size: int | None = None,
    nano_commit: str = HEAD,
) -> DesignResult | dict:
    """One design's run; vLLM's is the replay's own result dict (``to_dict``)."""
    engine = settings.engine
    if design == "vllm":
        return replay(trace, settings).to_dict(series_points=200)
    if settings.arrival != "sequential":
        raise CompareError("one_at_a_time", design=design_name(design, nano_commit))
    t0 = time.perf_counter()
    requests = trace_requests(trace)
    if design == "sglang":
        ps = page_size or engine.block_size
        run = SGLangRun(size=engine.num_gpu_blocks * engine.block_size, page_size=ps)
        _drive(run, requests)
        return _finish(design, run, trace, t0, run.evicted_tokens // ps, run.evicted_tokens)
    run = NanoRun(engine.num_gpu_blocks, engine.block_size, commit=nano_commit)
    _drive(run, requests)
    evicted = run.evictions * engine.block_size
    return _finish(design, run, trace, t0, run.evictions, evicted, nano_commit=run.commit)


def compare(
    trace: Trace,
    settings: ReplaySettings,
    designs=DESIGNS,
    page_size: int | None = None,
    nano_commit: str = HEAD,
) -> dict:
    """``{"designs": {name: figures}, "kv_tokens": ..., "settings": ...}``; a design that cannot
    run the trace (too little memory for one request) reports ``{"error": why}``."""
    if page_size is not None and page_size < 1:
        raise CompareError("page_size", got=page_size)
    engine = settings.engine
    out = {}
    for design in designs:
        try:
            r = run_design(design, trace, settings, page_size, nano_commit)
            out[design] = r if isinstance(r, dict) else r.to_dict()
        except DesignError as e:
            out[design] = {"error": str(e), "name": design_name(design, nano_commit)}
        if design == "vllm" and "error" not in out[design]:
            out[design]["name"] = NAMES["vllm"]
    return {
        "trace": trace.name,
        "requests": len(trace),
        "kv_tokens": engine.num_gpu_blocks * engine.block_size,
        "block_size": engine.block_size,
        "page_size": page_size or engine.block_size,
        "nano_commit": nano_commit,
        "arrival": settings.arrival,
        "settings": settings.to_dict(),
        "designs": out,
    }


def sweep_compare(
    trace: Trace,
    make_settings,
    values,
    designs=DESIGNS,
    page_size: int | None = None,
    nano_commit: str = HEAD,
) -> list[dict]:
    """compare() once per ``num_gpu_blocks`` value: the points of each design's hit-rate curve."""
    return [
        sweep_row(v, compare(trace, make_settings(v), designs, page_size, nano_commit))
        for v in values
    ]


def sweep_row(value: int, res: dict) -> dict:
    """One point of the curves: each design's hit rate at ``num_gpu_blocks`` = value."""
    return {
        "num_gpu_blocks": value,
        "kv_tokens": res["kv_tokens"],
        **{d: (None if "error" in r else r["hit_rate"]) for d, r in res["designs"].items()},
    }
