"""The speculative-decoding settings the KV cache reads (vLLM: vllm/config/speculative.py). vLLM
derives two decisions from them for the prefix cache, each where vLLM makes it: whether block
hashes look ahead (``resolve_num_hash_lookahead_tokens`` in kvcore/config/vllm.py, vLLM's
``VllmConfig._resolve_num_hash_lookahead_tokens``) and whether the KV cache manager drops the
last matched block of a hit (``use_eagle_block_drop`` in kvcore/core/sched/scheduler.py, what
vLLM's ``Scheduler.__init__`` passes as ``KVCacheManager(use_eagle=...)``).

Why a drop at all: an EAGLE or MTP drafter builds its own K/V at a position from the target's
hidden state there *and the token after it*. The hash of a block covers only the block's tokens,
so a later request that shares the block may continue with another token, and the drafter's
K/V for the block's last position would be wrong for it. vLLM's two answers: hash each block
together with the tokens after it (lookahead hashes, the default where they are possible), or
give up the last matched block of every hit so it is computed again (the drop).
"""

from __future__ import annotations

from dataclasses import dataclass

# vLLM's SpeculativeConfig.use_eagle() is true for these methods; the rest of its list
# ("dflash", "dspark") builds draft K/V from the hidden state alone and needs no drop.
EAGLE_METHODS = ("eagle", "eagle3", "mtp")
HIDDEN_STATE_ONLY_METHODS = ("dflash", "dspark")


@dataclass(frozen=True)
class SpeculativeConfig:
    """vLLM's fields of the same names. ``disable_eagle_block_drop`` turns off both the drop and
    the lookahead hashes (vLLM calls it experimental: it reuses the block anyway);
    ``disable_lookahead_block_hashes`` keeps plain hashes, so the drop applies."""

    method: str
    num_speculative_tokens: int = 1
    disable_eagle_block_drop: bool = False
    disable_lookahead_block_hashes: bool = False

    def use_eagle(self) -> bool:
        return self.method in EAGLE_METHODS + HIDDEN_STATE_ONLY_METHODS

    def needs_eagle_block_drop(self) -> bool:
        """Whether the drafter's K/V at a position depends on the next token."""
        return self.use_eagle() and self.method not in HIDDEN_STATE_ONLY_METHODS

    def use_eagle_block_drop(self) -> bool:
        return self.needs_eagle_block_drop() and not self.disable_eagle_block_drop

    @property
    def num_prefill_lookahead_tokens(self) -> int:
        """Prompt tokens past the computed range the drafter reads: one for a drafter on the
        target's hidden states (EAGLE, EAGLE-3, single-module MTP), none otherwise. (vLLM's
        multi-module MTP reads ``num_speculative_tokens``; it is not modelled here.)"""
        return 1 if self.use_eagle() else 0
