"""nano-vllm's block manager, modelled at two commits of github.com/GeeeekExplorer/nano-vllm.

``HEAD`` (bb823b3, main on 2026-04-26, after "fix cache hit" 9fa256a) is the default. ``OLD``
(2f352ae, 2025-11-12) is the head of pull request #132 (Qwen3-VL), never merged into main; its
block manager is main's of 2f21442 (2025-11-04) plus ``non_cache_token_ids``. What differs, in
``engine/block_manager.py``:

- the hit rule: at OLD ``allocate`` looks up every block, a full last block included, so a
  prompt can be cached whole; at HEAD ``can_allocate`` looks up ``range(seq.num_blocks - 1)``,
  so the prompt's last block is never a hit (as in vLLM, at least one token is computed);
- stale entries: at OLD a reused block's ``hash_to_block_id`` entry stays (the token-id check
  turns it into a miss); at HEAD ``_allocate_block`` deletes the entry that names the block;
- when a block gets its hash: at OLD in ``allocate`` (every full prompt block, before its K/V is
  computed) and in ``may_append``; at HEAD in ``hash_blocks``, after the step that computed it
  (the scheduler's ``postprocess``), so a prompt never hits a block whose K/V the same batch is
  still computing;
- ``can_allocate``: at OLD every block counts as new; at HEAD a hit on a block in use does not.
"""

from __future__ import annotations

HEAD = "bb823b3"
OLD = "2f352ae"
COMMITS = {
    HEAD: "bb823b3e06983d71485a8e1f23715ebd87d98ef8",
    OLD: "2f352aea436c1d8c49a6c15f67b40bb32c0c2a8c",
}


def check_commit(commit: str) -> str:
    """The short name of a modelled commit (a full hash or any prefix of 7+ digits works)."""
    for short, full in COMMITS.items():
        if len(commit) >= 7 and full.startswith(commit.lower()):
            return short
    raise ValueError(f"nano-vllm commit {commit!r} is not modelled; choose {' or '.join(COMMITS)}")
