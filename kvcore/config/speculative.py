"""The speculative-decoding settings the KV cache reads (vLLM: vllm/config/speculative.py), and
the two decisions vLLM derives from them for the prefix cache: whether block hashes look ahead
(``VllmConfig._resolve_num_hash_lookahead_tokens`` in vllm/config/vllm.py) and whether the KV
cache manager drops the last matched block of a hit (``Scheduler.__init__`` in
vllm/v1/core/sched/scheduler.py passes it as ``KVCacheManager(use_eagle=...)``).

Why a drop at all: an EAGLE or MTP drafter builds its own K/V at a position from the target's
hidden state there *and the token after it*. The hash of a block covers only the block's tokens,
so a later request that shares the block may continue with another token, and the drafter's
K/V for the block's last position would be wrong for it. vLLM's two answers: hash each block
together with the tokens after it (lookahead hashes, the default where they are possible), or
give up the last matched block of every hit so it is computed again (the drop).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

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


def resolve_num_hash_lookahead_tokens(
    speculative_config: Optional[SpeculativeConfig],
    enable_prefix_caching: bool,
    connector_supports_lookahead_block_hashes: Optional[bool] = None,
) -> int:
    """Tokens after each block that its hash also covers (vLLM 0.34.0's
    ``VllmConfig._resolve_num_hash_lookahead_tokens``): the drafter's prefill lookahead when the
    block drop is on and lookahead hashes are not disabled, with prefix caching on and no KV
    connector, or a connector that supports them (``connector_supports_lookahead_block_hashes``;
    None = no connector). 0 keeps plain hashes."""
    if (
        speculative_config is None
        or not speculative_config.use_eagle_block_drop()
        or speculative_config.disable_lookahead_block_hashes
    ):
        return 0
    if connector_supports_lookahead_block_hashes is not None:
        if not connector_supports_lookahead_block_hashes:
            return 0
    elif not enable_prefix_caching:
        return 0
    return speculative_config.num_prefill_lookahead_tokens


def use_eagle_block_drop(
    speculative_config: Optional[SpeculativeConfig], num_hash_lookahead_tokens: int
) -> bool:
    """What vLLM's Scheduler passes as ``KVCacheManager(use_eagle=...)``: the drop, unless
    lookahead hashes already prove the token after each block."""
    if speculative_config is None or num_hash_lookahead_tokens:
        return False
    return speculative_config.use_eagle_block_drop()
