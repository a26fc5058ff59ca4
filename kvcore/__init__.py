"""kvcore: vLLM v1's paged KV-cache management, re-written to be read beside vLLM 0.34.0.

Each file sits where vLLM keeps the same class: ``vllm/v1/<path>.py`` is ``kvcore/<path>.py``
(``vllm/distributed/kv_events.py`` is ``kvcore/distributed/kv_events.py``), under vLLM 0.34.0's
names: the model runner and the speculators under ``worker/gpu/``, where 0.34 moved them
(docs/from-0.33-to-0.34.md). Files with no vLLM counterpart
(``OURS`` in tests/project/test_docs.py: ``kvcore.model``, the worker's paged attention and
draft / EAGLE runners, the observer and inspection modules of ``kvcore.core``) are kvcore's
own. Pure Python except ``kvcore.model`` and ``kvcore.worker`` (torch + transformers).
"""
