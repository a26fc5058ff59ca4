"""Runs op sequences through SGLang 0.5.23's own RadixCache;
tests/differential/test_designs_fidelity.py starts it under the scratch environment of
scripts/sglang_env.sh and feeds it the same ops as our model.

Protocol: one JSON case per stdin line, one JSON answer per stdout line. A case is
``{"page_size": N, "policy": "lru", "ops": [...]}``; the ops are ``["match", tokens]``,
``["insert", tokens, slots]``, ``["lock", i]`` / ``["unlock", i]`` (the node op ``i`` returned),
``["evict", num_tokens]``. The answer lists, per op, what it returned and the sizes after it.
SGLang's ``time.monotonic`` is replaced by a counter (ours ticks the same way), so access times
never tie and the eviction order is exact rather than left to equal timestamps.
"""

import itertools
import json
import sys
import types
from array import array


def main() -> None:
    import importlib.metadata

    import torch
    from sglang.srt.mem_cache import radix_cache as rc
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams

    class Allocator:
        device = "cpu"

        def __init__(self):
            self.freed = []

        def free_segment(self, values, start_pos=0):
            self.freed.append([int(v) for v in values])

    print(json.dumps({"ready": importlib.metadata.version("sglang")}), flush=True)
    for line in sys.stdin:
        case = json.loads(line)
        tick = itertools.count(1)
        rc.time = types.SimpleNamespace(
            monotonic=lambda: next(tick), perf_counter=rc.time.perf_counter
        )
        alloc = Allocator()
        tree = rc.RadixCache.create_simulated(page_size=case["page_size"], mock_allocator=alloc)
        tree.eviction_strategy = rc.get_eviction_strategy(case.get("policy", "lru"))
        nodes, out = {}, []
        for i, op in enumerate(case["ops"]):
            name = op[0]
            if name == "match":
                key = rc.RadixKey(array("q", op[1]))
                r = tree.match_prefix(MatchPrefixParams(key=key))
                nodes[i] = r.last_device_node
                got = r.device_prefix_len
            elif name == "insert":
                key = rc.RadixKey(array("q", op[1]))
                value = torch.tensor(op[2], dtype=torch.int64)
                r = tree.insert(InsertParams(key=key, value=value))
                nodes[i] = r.last_device_node
                got = r.prefix_len
            elif name == "lock":
                got = tree.inc_lock_ref(nodes[op[1]]).delta
            elif name == "unlock":
                got = tree.dec_lock_ref(nodes[op[1]]).delta
            elif name == "evict":
                alloc.freed = []
                got = [tree.evict(EvictParams(num_tokens=op[1])).num_tokens_evicted, alloc.freed]
            else:
                raise ValueError(f"unknown op {name!r}")
            out.append([got, tree.evictable_size(), tree.protected_size(), tree.total_size()])
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
