"""Real workloads: production request traces replayed through kvcore, model-free.

``trace`` reads Mooncake's and Qwen-Bailian's JSONL formats, ``tokens`` turns hash ids into
prompt tokens that share exactly what the trace shares, ``replay`` drives the real kvcore
Scheduler / KVCacheManager / BlockPool with them, ``sweep`` asks "what if" over settings and
``bound`` answers, in one pass, what an unbounded pool reaches and the smallest pool that does.
"""

from pathlib import Path

# The real trace shipped with the project (Mooncake's, Apache-2.0: see traces/README.md).
SHIPPED_TRACE = Path(__file__).resolve().parent / "traces" / "mooncake_synthetic_trace.jsonl"
