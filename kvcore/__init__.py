"""kvcore: vLLM v1's paged KV-cache management, re-written to be read beside vLLM 0.34.0.

Each file sits where vLLM keeps the same class: ``vllm/v1/<path>.py`` is ``kvcore/<path>.py``
(``vllm/distributed/kv_events.py`` is ``kvcore/distributed/kv_events.py``). Not moved yet: the
files 0.34 moved under ``vllm/v1/worker/gpu/`` or removed with its first model runner stay at
their 0.33.0 paths (``worker/gpu_model_runner.py``, ``worker/gpu_input_batch.py``,
``sample/rejection_sampler.py``, ``spec_decode/ngram_proposer.py``, ``spec_decode/eagle.py``,
``spec_decode/draft_model.py``; docs/from-0.33-to-0.34.md). Files with no vLLM counterpart
(``OURS`` in tests/project/test_docs.py: ``kvcore.model``, the worker's paged attention and
draft / EAGLE runners, the observer and inspection modules of ``kvcore.core``) are kvcore's
own. Pure Python except ``kvcore.model`` and ``kvcore.worker`` (torch + transformers).
"""
