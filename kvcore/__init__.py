"""kvcore: vLLM v1's paged KV-cache management, re-written to be read beside vLLM 0.33.0.

Each file sits where vLLM keeps the same class: ``vllm/v1/<path>.py`` is ``kvcore/<path>.py``
(``vllm/distributed/kv_events.py`` is ``kvcore/distributed/kv_events.py``). Pure Python except
``kvcore.model`` and ``kvcore.worker`` (torch + transformers).
"""
