"""A test/bench-only driver for :class:`ModelRunner`: a trivial engine around it (lives under tests/, not in the package).

It is *not* the project's engine (that is record/engine.py with vLLM's block manager
and scheduler); it exists so that the model side can be checked against transformers
on its own: a refcounted allocator handing out fresh block ids, block tables per KV
cache group, chunked prefill, decode, prefix reuse (sharing another request's first
full blocks), preemption by recompute, and the sliding-window rule that replaces
blocks wholly outside the window with the null block 0 and frees them.

Freed blocks are overwritten with large finite garbage (``poison``), so a runner that
read a block it should not would produce visibly wrong logits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

import torch

from kvcore.worker.gpu_model_runner import ModelRunner, SeqBatchItem

NULL_BLOCK = 0


class BlockAllocator:
    """Fresh ids first (1, 2, 3, ...), then freed ones (FIFO); block 0 is the null block.

    ``prefer_freed=True`` hands out freed blocks before fresh ones (stresses reuse)."""

    def __init__(self, num_blocks: int, prefer_freed: bool = False):
        self.num_blocks = num_blocks
        self.prefer_freed = prefer_freed
        self._next_fresh = 1
        self._free: list[int] = []
        self.ref: dict[int, int] = {}

    def allocate(self) -> int:
        if self._free and (self.prefer_freed or self._next_fresh >= self.num_blocks):
            bid = self._free.pop(0)
        elif self._next_fresh < self.num_blocks:
            bid = self._next_fresh
            self._next_fresh += 1
        else:
            raise RuntimeError("out of KV blocks")
        self.ref[bid] = 1
        return bid

    def incref(self, bid: int) -> None:
        self.ref[bid] += 1

    def free(self, bid: int) -> bool:
        """Drop one reference; True when the block became free."""
        if bid == NULL_BLOCK:
            return False
        self.ref[bid] -= 1
        if self.ref[bid] == 0:
            del self.ref[bid]
            self._free.append(bid)
            return True
        return False

    @property
    def num_used(self) -> int:
        return len(self.ref)


@dataclass
class _Req:
    rid: str
    prompt: list[int]
    max_new_tokens: int
    tables: list[list[int]]
    computed: int = 0
    output: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)
    finished: bool = False

    @property
    def known(self) -> list[int]:
        return self.prompt + self.output


class MiniEngine:
    """Drives a ModelRunner step by step like an engine would (for tests and benchmarks).

    chunk_size: at most this many tokens of a request per step (chunked prefill).
    poison: value written into every block when it is freed (None: leave it).
    prefer_freed: reuse freed blocks before fresh ones.
    collect_logits: call ``execute_logits`` and keep every sampled position's logits
    (greedy argmax is then taken here, exactly like the runner's greedy path).
    """

    def __init__(self, runner: ModelRunner, chunk_size: int | None = None,
                 collect_logits: bool = False, eos_ids: Iterable[int] = (), poison: float | None = 1e4,
                 prefer_freed: bool = False):
        self.runner = runner
        self.bs = runner.block_size
        self.windows = runner.group_sliding_window
        self.alloc = BlockAllocator(runner.num_blocks, prefer_freed)
        self.chunk_size = chunk_size
        self.collect_logits = collect_logits
        self.eos_ids = set(eos_ids)
        self.poison = poison
        self.reqs: dict[str, _Req] = {}
        self.steps = 0
        self.history: list[list[SeqBatchItem]] = []

    # ---------------------------------------------------------------- requests
    def add(self, rid: str, prompt: Sequence[int], max_new_tokens: int,
            prefix_of: str | None = None, prefix_blocks: int = 0) -> None:
        """Add a request; optionally reuse the first ``prefix_blocks`` full blocks of ``prefix_of``.

        The caller guarantees the shared tokens are identical (like a prefix-cache hit)."""
        r = _Req(rid, list(prompt), max_new_tokens, [[] for _ in self.windows])
        if prefix_of is not None and prefix_blocks > 0:
            src = self.reqs[prefix_of]
            n = prefix_blocks * self.bs
            if src.computed < n or src.known[:n] != r.prompt[:n] or len(r.prompt) <= n:
                raise ValueError("prefix reuse needs computed, identical full blocks and a tail to feed")
            for g in range(len(self.windows)):
                shared = src.tables[g][:prefix_blocks]
                for b in shared:
                    if b != NULL_BLOCK:
                        self.alloc.incref(b)
                r.tables[g] = list(shared)
            r.computed = n
        self.reqs[rid] = r

    def preempt(self, rid: str) -> None:
        """Preemption by recompute: free every block (last first); redo prompt + output later."""
        r = self.reqs[rid]
        for g, table in enumerate(r.tables):
            for b in reversed(table):
                self._free(b)
            r.tables[g] = []
        r.computed = 0

    def _free(self, bid: int) -> None:
        if self.alloc.free(bid) and self.poison is not None:
            with torch.inference_mode():
                for t in self.runner.kv_caches:
                    t[bid].fill_(self.poison)

    # ---------------------------------------------------------------- steps
    def _prepare(self, r: _Req) -> SeqBatchItem:
        known = r.known
        start = r.computed
        n = len(known) - start
        if self.chunk_size is not None:
            n = min(n, self.chunk_size)
        end = start + n
        for g, W in enumerate(self.windows):
            table = r.tables[g]
            if W is not None:  # blocks wholly before start-W+1 can never be read again
                for i in range(max(0, start - W + 1) // self.bs):
                    if table[i] != NULL_BLOCK:
                        self._free(table[i])
                        table[i] = NULL_BLOCK
            while len(table) * self.bs < end:
                table.append(self.alloc.allocate())
        return SeqBatchItem(r.rid, known[start:end], start, tuple(list(t) for t in r.tables),
                            end == len(known))

    def step(self, rids: Sequence[str] | None = None) -> dict[str, int]:
        """Schedule the given (default: all unfinished) requests in one forward."""
        if rids is None:
            rids = [rid for rid, r in self.reqs.items() if not r.finished]
        items = [self._prepare(self.reqs[rid]) for rid in rids]
        if not items:
            return {}
        self.history.append(items)
        if self.collect_logits:
            logits = self.runner.execute_logits(items)
            sampled = {rid: int(torch.argmax(lg)) for rid, lg in logits.items()}
        else:
            logits = {}
            sampled = self.runner.execute(items)
        self.steps += 1
        for it in items:
            r = self.reqs[it.request_id]
            r.computed = it.start_pos + len(it.token_ids)
            if it.sample:
                tok = sampled[it.request_id]
                r.output.append(tok)
                if it.request_id in logits:
                    r.logits.append(logits[it.request_id])
                if len(r.output) >= r.max_new_tokens or tok in self.eos_ids:
                    r.finished = True
        return sampled

    def run(self, max_steps: int = 10_000) -> dict[str, list[int]]:
        for _ in range(max_steps):
            if all(r.finished for r in self.reqs.values()):
                break
            self.step()
        return self.outputs()

    def finish(self, rid: str) -> None:
        """Free a finished request's blocks (last block first)."""
        r = self.reqs[rid]
        r.finished = True
        self.preempt(rid)

    def outputs(self) -> dict[str, list[int]]:
        return {rid: list(r.output) for rid, r in self.reqs.items()}


# -------------------------------------------------------------------- references
@torch.inference_mode()
def reference_generate(model, prompt: Sequence[int], max_new_tokens: int, pad_token_id: int,
                       eos_token_id=None) -> list[int]:
    """transformers' greedy ``generate`` for one prompt (stops at EOS like the driver)."""
    dev = next(model.parameters()).device
    ids = torch.tensor([list(prompt)], dtype=torch.long, device=dev)
    kw = {} if eos_token_id is None else {"eos_token_id": eos_token_id}  # default: the model's EOS
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens,
        pad_token_id=pad_token_id, **kw,
    )
    return out[0, len(prompt):].tolist()


@torch.inference_mode()
def reference_logits(model, prompt: Sequence[int], output: Sequence[int]) -> torch.Tensor:
    """Logits (float32, CPU) predicting each output token, from one full forward of prompt+output."""
    dev = next(model.parameters()).device
    full = list(prompt) + list(output)
    ids = torch.tensor([full], dtype=torch.long, device=dev)
    logits = model(ids, use_cache=False).logits[0].float().cpu()
    n = len(output)
    return logits[len(prompt) - 1: len(prompt) - 1 + n]


# -------------------------------------------------------------------- half precision
@dataclass(frozen=True)
class Agreement:
    """How closely the paged runner follows transformers in the model's own dtype.

    paged_diff: largest |logit difference| between the paged runner and one full forward of
    transformers over the same tokens (same weights, same dtype).  reference_noise: the same
    measure between transformers' own ``generate`` (with its KV cache) and that full forward --
    how far two correct implementations already drift apart in this dtype.  A greedy divergence
    is *explained* when, at the first differing position, ``generate``'s logits rank the two
    candidates closer than ``paged_diff + reference_noise`` (a near tie that rounding may flip).
    """

    dtype: str
    paged_diff: float
    reference_noise: float
    tokens_equal: int            # tokens equal to generate's, each request up to its first difference
    tokens_total: int            # tokens compared (each request: the shorter of the two outputs)
    divergences: tuple[tuple[str, int, float], ...]  # (request, position, generate's top-2 margin there)

    @property
    def divergences_explained(self) -> bool:
        bound = self.paged_diff + self.reference_noise
        return all(margin <= bound for _, _, margin in self.divergences)


@torch.inference_mode()
def measure_agreement(loaded, prompts: Sequence[Sequence[int]], new_tokens: int,
                      block_size: int = 16) -> Agreement:
    """Run ``prompts`` together through the paged runner and one by one through ``generate``.

    Both stop at the model's EOS (no logits processor touches ``generate``'s greedy choice,
    so its raw logits are the ones it chose from); a request is compared over the tokens
    both produced."""
    model = loaded.model
    dev = next(model.parameters()).device
    eos = sorted(loaded.eos_ids)
    runner = ModelRunner(loaded, num_blocks=1 + sum(-(-(len(p) + new_tokens) // block_size) for p in prompts),
                         block_size=block_size)
    eng = MiniEngine(runner, collect_logits=True, poison=None, eos_ids=eos)
    for i, p in enumerate(prompts):
        eng.add(f"r{i}", p, new_tokens)
    paged = eng.run()
    pad = getattr(loaded.tokenizer, "pad_token_id", None) or 0
    paged_diff = noise = 0.0
    equal = total = 0
    divergences = []
    for i, p in enumerate(prompts):
        rid = f"r{i}"
        ids = torch.tensor([list(p)], dtype=torch.long, device=dev)
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=new_tokens, pad_token_id=pad, eos_token_id=eos,
                             output_logits=True, return_dict_in_generate=True)
        g = gen.sequences[0, len(p):].tolist()
        g_logits = torch.stack([lg[0].float().cpu() for lg in gen.logits])
        noise = max(noise, (g_logits - reference_logits(model, p, g)).abs().max().item())
        o = paged[rid]
        p_logits = torch.stack(eng.reqs[rid].logits)
        paged_diff = max(paged_diff, (p_logits - reference_logits(model, p, o)).abs().max().item())
        n = min(len(o), len(g))
        k = next((j for j in range(n) if o[j] != g[j]), n)
        equal += k
        total += n
        if k < n:
            divergences.append((rid, k, (g_logits[k, g[k]] - g_logits[k, o[k]]).item()))
    return Agreement(str(loaded.dtype).replace("torch.", ""), paged_diff, noise, equal, total,
                     tuple(divergences))
