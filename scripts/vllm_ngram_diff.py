"""kvcore's n-gram proposer against vLLM 0.34.0's ``NgramGPUSpeculator`` on random token histories.

Run it with the Python of the scratch vLLM environment (``bash scripts/vllm_env.sh``):

    /tmp/vllm034-venv/bin/python scripts/vllm_ngram_diff.py --groups 12 --seed 1

vLLM 0.34.0 drafts n-grams with two Triton kernels (vllm/v1/worker/gpu/spec_decode/ngram/
speculator.py: ``_ngram_scan_kernel`` scores every candidate match, ``_ngram_finalize_kernel``
gathers the drafts and pads them). No GPU is needed: Triton's interpreter
(``TRITON_INTERPRET=1``) runs the very same kernels with numpy. Two things make that work here:

- vLLM's ``vllm.triton_utils`` switches Triton off on a host with no GPU driver, except where
  ``CUDA_VISIBLE_DEVICES`` is set and empty (its allowance for a distributed start-up); the
  script sets it so, before importing vLLM, so the kernels are real ``triton.jit`` functions;
- the interpreter's masked load accepts only a boolean numpy mask, and one mask in the finalize
  kernel reaches it as int32 (compiled Triton has a 1-bit mask there); the script casts such a
  mask to bool, which changes no lane (nonzero is true either way).

Each group draws the settings (``prompt_lookup_min``, ``prompt_lookup_max``,
``num_speculative_tokens``, ``max_model_len``, the scan's block length) and a batch of token
histories: random tokens from a small vocabulary, with repeated stretches so that long matches,
several occurrences and overlapping ones all happen. Every row has sampled (``num_sampled`` 1),
as kvcore proposes only for those. Both sides draft for every history; vLLM's drafts are compared
up to ``max_model_len`` (its scheduler cuts the rest, kvcore does not list them). The first
difference is printed with its settings and history, and the exit status is 1.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"
os.environ["CUDA_VISIBLE_DEVICES"] = ""
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

from kvcore.worker.gpu.spec_decode.ngram.speculator import NgramGPUSpeculator  # noqa: E402

_masked_load = interpreter.InterpreterBuilder.create_masked_load


def _bool_mask_load(self, ptrs, mask, other, *rest):
    if mask.data.dtype != bool:
        mask = interpreter.TensorHandle(mask.data.astype(bool), mask.dtype)
    return _masked_load(self, ptrs, mask, other, *rest)


interpreter.InterpreterBuilder.create_masked_load = _bool_mask_load

from vllm.v1.worker.gpu.spec_decode.ngram import speculator  # noqa: E402


def po2(x: int) -> int:
    return 1 << max(0, x - 1).bit_length()


def vllm_drafts(histories, min_n, max_n, k, max_model_len, block_l) -> list[list[int]]:
    """One call of vLLM's two kernels over a batch, laid out as ``NgramGPUSpeculator.propose``
    lays it out (one row of ``max_model_len`` token ids per request, its length in
    ``total_len``, its last sampled token in ``last_sampled``)."""
    b = len(histories)
    token_ids = torch.zeros((b, max_model_len), dtype=torch.int32)
    for i, h in enumerate(histories):
        token_ids[i, : len(h)] = torch.tensor(h, dtype=torch.int32)
    idx_mapping = torch.arange(b, dtype=torch.int64)
    total_len = torch.tensor([len(h) for h in histories], dtype=torch.int32)
    num_sampled = torch.ones(b, dtype=torch.int32)
    last_sampled = torch.tensor([h[-1] for h in histories], dtype=torch.int64)
    n_blocks = -(-max_model_len // block_l)
    scratch = torch.zeros((b, n_blocks), dtype=torch.int64)
    drafts = torch.zeros((b, k), dtype=torch.int64)
    speculator._ngram_scan_kernel[(b, n_blocks)](
        token_ids, token_ids.stride(0), idx_mapping, total_len, num_sampled, scratch,
        scratch.stride(0), max_model_len, min_n, max_n, po2(max_n), block_l,
    )  # fmt: skip
    speculator._ngram_finalize_kernel[(b,)](
        token_ids, token_ids.stride(0), idx_mapping, total_len, num_sampled, last_sampled,
        scratch, scratch.stride(0), drafts, max_model_len, n_blocks, k, po2(k), po2(n_blocks),
    )  # fmt: skip
    return drafts.tolist()


def ours(history, min_n, max_n, k, max_model_len) -> list[int]:
    return NgramGPUSpeculator(min_n, max_n, k, max_model_len).propose(history)


def history(rng: random.Random, max_len: int) -> list[int]:
    vocab = rng.choice((2, 3, 5, 9))
    out: list[int] = []
    length = rng.randint(1, max_len)
    while len(out) < length:
        if out and rng.random() < 0.4:  # repeat a stretch seen before
            start = rng.randrange(len(out))
            out += out[start : start + rng.randint(1, 6)]
        else:
            out.append(rng.randrange(vocab))
    return out[:length]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=12)
    ap.add_argument("--batch", type=int, default=40)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    checked = matched = 0
    for group in range(args.groups):
        min_n = rng.randint(1, 3)
        max_n = min_n + rng.randint(0, 3)
        k = rng.randint(1, 8)
        max_model_len = rng.choice((40, 64, 100))
        block_l = rng.choice((16, 32, 64))
        batch = [history(rng, max_model_len - 1) for _ in range(args.batch)]
        theirs = vllm_drafts(batch, min_n, max_n, k, max_model_len, block_l)
        for h, want in zip(batch, theirs):
            # vLLM's scheduler runs no draft at or past max_model_len; kvcore's list stops there
            want = want[: max_model_len - len(h)]
            got = ours(h, min_n, max_n, k, max_model_len)
            if got != want:
                print(
                    f"group {group}: min_n={min_n} max_n={max_n} k={k} "
                    f"max_model_len={max_model_len} block_l={block_l}\n"
                    f"history {h}\nvLLM {want} vs ours {got}"
                )
                return 1
            checked += 1
            n, _ = NgramGPUSpeculator(min_n, max_n, k, max_model_len).find_match(h)
            matched += bool(n)
    print(f"SAME: {checked} random histories ({matched} with a match) in {args.groups} groups")
    return 0


if __name__ == "__main__":
    sys.exit(main())
