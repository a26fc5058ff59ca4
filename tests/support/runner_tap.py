"""The real engine (record.engine.Engine) with its model runner watched: the model tests drive
a scenario through it and read what the runner was given and what it computed.

``TappedRun`` puts itself between the engine's EngineCore and its GPUModelRunner (the engine's own
``runner`` attribute stays the real one). For every forward it keeps the batch (the
``SeqBatchItem`` list, by step), the paged kernel's gathered block ids, and, with
``logits=True``, every sampled position's logits (the greedy token is then their argmax, as
``GPUModelRunner.execute`` takes it). Before each forward it overwrites the blocks that sit in the
free queue without a hash with large finite garbage (``poison``): nothing may read them, so a
runner or a block manager that did would produce visibly wrong logits. Cached free blocks are
left alone: a later prefix hit may legitimately read them.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

import torch

from paged_kv_lab.run.engine import Engine
from paged_kv_lab.run.scenario import load_scenario


def req(rid: str, ids: Sequence[int], max_tokens: int, arrival: int = 0, **kw) -> dict:
    """One request of a scenario file, by token ids."""
    return {
        "id": rid,
        "prompt_token_ids": list(ids),
        "max_tokens": max_tokens,
        "arrival_step": arrival,
        **kw,
    }


def scenario(lm, requests: Sequence[dict], **engine):
    """A scenario as a file would hold it (run/scenario.py validates it), on ``lm``."""
    return load_scenario(
        {
            "name": "model-test",
            "model": lm.name,
            "device": "cpu",
            "dtype": str(lm.dtype).replace("torch.", ""),
            "engine": engine,
            "requests": list(requests),
        }
    )


class TappedRun:
    def __init__(
        self,
        lm,
        requests: Sequence[dict],
        *,
        logits: bool = True,
        poison: float | None = 1e4,
        **engine,
    ) -> None:
        self.eng = Engine(scenario(lm, requests, **engine), model=lm)
        self.runner = self.eng.runner
        self.pool = self.eng.kv_cache_manager.block_pool
        self.specs = {r.id: r for r in self.eng.scenario.requests}
        self.collect = logits
        self.poison = poison
        self.poisoned: set[int] = set()
        self.batches: dict[int, list] = {}  # step -> the items of its forward
        self.gathered: dict[int, list] = {}  # step -> per group, the block ids the kernel read
        self.logits: dict[str, list[torch.Tensor]] = defaultdict(list)
        self.records: list = []
        self.eng.engine_core.model_runner = self

    # -- what EngineCore calls --------------------------------------------------------------
    @property
    def last_inputs(self):
        return self.runner.last_inputs

    def execute(self, items):
        self._poison_free_blocks()
        step = self.eng.step_count
        self.batches[step] = list(items)
        if self.collect:
            logits = self.runner.execute_logits(items)
            for rid, lg in logits.items():
                self.logits[rid].append(lg)
            sampled = {rid: int(torch.argmax(lg)) for rid, lg in logits.items()}
        else:
            sampled = self.runner.execute(items)
        last = self.runner.last_step
        if last is not None:
            self.gathered[step] = [list(gs.gathered_block_ids) for gs in last.groups]
        return sampled

    def _poison_free_blocks(self) -> None:
        if self.poison is None:
            return
        free = {
            b.block_id
            for b in self.pool.free_block_queue.get_all_free_blocks()
            if b.block_hash is None
        }
        fresh = free - self.poisoned
        if fresh:
            with torch.inference_mode():
                for t in self.runner.kv_caches:
                    for bid in fresh:
                        t[bid].fill_(self.poison)
        self.poisoned = free

    # -- driving -----------------------------------------------------------------------------
    def step(self):
        rec = self.eng.step()
        self.records.append(rec)
        return rec

    def run(self, max_steps: int = 10_000) -> dict[str, list[int]]:
        self.records += self.eng.run(max_steps=max_steps)
        return self.outputs()

    def outputs(self) -> dict[str, list[int]]:
        return {rid: list(o["token_ids"]) for rid, o in self.eng.outputs().items()}

    def items_of(self, rid: str) -> list:
        """``rid``'s batch items, step by step."""
        return [
            it for step in sorted(self.batches) for it in self.batches[step] if it.request_id == rid
        ]

    def events(self, kind: str) -> list:
        return [e for r in self.records for e in r.events if e.kind == kind]


# -- transformers, the reference ------------------------------------------------------------------
def pad_id(lm) -> int:
    p = getattr(lm.tokenizer, "pad_token_id", None)
    return int(p) if p is not None else 0


@torch.inference_mode()
def reference_generate(
    model, prompt: Sequence[int], max_new_tokens: int, pad_token_id: int, eos_token_id=None
) -> list[int]:
    """transformers' greedy ``generate`` for one prompt (stops at EOS like the engine)."""
    dev = next(model.parameters()).device
    ids = torch.tensor([list(prompt)], dtype=torch.long, device=dev)
    kw = {} if eos_token_id is None else {"eos_token_id": eos_token_id}  # default: the model's EOS
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        pad_token_id=pad_token_id,
        **kw,
    )
    return out[0, len(prompt) :].tolist()
