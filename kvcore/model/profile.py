"""Memory profiling: measure the loaded model on its device, for
:class:`~kvcore.model.memory.KVCacheSizing`.

As vLLM's ``profile_run``: one dummy forward of ``max_num_batched_tokens`` tokens (here one
request of token id 0 repeated), through a throw-away runner whose pool holds just those
tokens, so what the forward allocates is activations and nothing else.

- CUDA: the allocator's peak statistics (``reset_peak_memory_stats`` before,
  ``max_memory_allocated`` after, less what was allocated before), as vLLM reads them.
- CPU: torch keeps no allocator statistics for the CPU, so :class:`LiveTensorBytes` watches
  every op of the forward (a ``TorchDispatchMode``) and keeps the running sum of the bytes of
  storages the ops create, minus those freed when their last tensor dies: its peak is the
  CPU's equivalent of ``max_memory_allocated``.

After the profile, the memory free is measured as vLLM 0.34's extensible KV cache measures it
after warm-up (``MemoryProfile.free_memory`` and ``init_free_memory``): the forwards above are
the model's warm-up, and the throw-away runner is gone by then. CUDA: ``mem_get_info``'s free
memory once torch's cache is emptied; at start, that plus what torch holds. CPU, where no
allocator reserves the device: the machine's available memory (psutil) stands for the free
memory, and that plus the process's resident memory for the memory free at start.
"""

from __future__ import annotations

import gc
import time
import weakref

import psutil
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from kvcore.model.loader import LoadedModel
from kvcore.model.memory import MemoryProfile
from kvcore.utils.math_utils import cdiv


def _storage(t):
    """The storage behind a dense tensor; None for anything else (an opaque oneDNN weight)."""
    if not isinstance(t, torch.Tensor) or t.layout != torch.strided or t.is_mkldnn:
        return None
    try:
        return t.untyped_storage()
    except (NotImplementedError, RuntimeError):
        return None


class LiveTensorBytes(TorchDispatchMode):
    """Inside the mode: ``current`` = bytes of the storages created by ops run in it and still
    referenced by a live tensor; ``peak`` = the largest ``current`` seen.

    A storage counts once however many views of it exist; an op whose output shares an input's
    storage (a view, an in-place op) allocates nothing; storages that existed before the mode
    (weights, the KV pool) are never counted.
    """

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, list[int]] = {}  # storage data_ptr -> [nbytes, live tensors]
        self.current = 0
        self.peak = 0

    def _release(self, key: int) -> None:
        entry = self.live.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            self.current -= entry[0]
            del self.live[key]

    def _hold(self, t: torch.Tensor, inputs: set[int]) -> None:
        storage = _storage(t)
        if storage is None:
            return
        key = storage.data_ptr()
        if key == 0:
            return  # an empty tensor: no memory behind it
        if key in inputs and key not in self.live:
            return  # a view of (or write into) memory that predates the mode
        entry = self.live.get(key)
        if entry is None:
            entry = self.live[key] = [storage.nbytes(), 0]
            self.current += entry[0]
            self.peak = max(self.peak, self.current)
        entry[1] += 1
        weakref.finalize(t, self._release, key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {s.data_ptr() for s in map(_storage, tree_leaves((args, kwargs))) if s is not None}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._hold(t, inputs)
        return out


def weights_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters and buffers, each storage once (tied weights count once)."""
    seen: dict[int, int] = {}
    for t in list(model.parameters()) + list(model.buffers()):
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def _dummy_items(num_tokens: int, block_size: int, num_groups: int = 1):
    from kvcore.worker.gpu.input_batch import SeqBatchItem

    table = list(range(1, 1 + cdiv(num_tokens, block_size)))
    return [SeqBatchItem("profile", [0] * num_tokens, 0, (table,) * num_groups, True)]


def _profile_groups(config) -> list[int] | None:
    """The runner's ``layer_group`` for a profile: a hybrid model's linear layers in a state
    group of their own (group 1), its attention layers in group 0; None: one group."""
    types = list(getattr(config, "layer_types", None) or ())
    if "linear_attention" not in types:
        return None
    return [int(t == "linear_attention") for t in types]


@torch.inference_mode()
def profile_model(
    loaded: LoadedModel, max_num_batched_tokens: int = 256, block_size: int = 16
) -> MemoryProfile:
    """Weights, peak activations of one forward of ``max_num_batched_tokens`` tokens, and the
    rest, measured on ``loaded``'s device (see the module docstring)."""
    from kvcore.worker.gpu.model_runner import GPUModelRunner

    n = int(max_num_batched_tokens)
    if n < 1:
        raise ValueError(f"max_num_batched_tokens must be >= 1; got {n}")
    t0 = time.perf_counter()
    dev = loaded.device
    weights = weights_bytes(loaded.model)
    layer_group = _profile_groups(loaded.config)
    groups = 1 if layer_group is None else 2
    runner = GPUModelRunner(
        loaded,
        num_blocks=1 + cdiv(n, block_size),
        block_size=block_size,
        layer_group=layer_group,
        group_sliding_window=[None] * groups,
    )
    items = _dummy_items(n, block_size, groups)
    proc = psutil.Process()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
        before = torch.cuda.memory_allocated(dev)
        runner.execute(items)
        torch.cuda.synchronize(dev)
        peak = torch.cuda.max_memory_allocated(dev) - before
        del runner
        gc.collect()
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(dev)
        other = max(total - free - torch.cuda.memory_reserved(dev), 0)
        rss = 0
        init_free = free + torch.cuda.memory_reserved(dev)
    else:
        runner.execute(items)  # warm-up: one-time set-up inside torch is not an activation
        gc.collect()
        rss = proc.memory_info().rss
        with LiveTensorBytes() as meter:
            runner.execute(items)
        peak = meter.peak
        total = psutil.virtual_memory().total
        other = max(rss - weights, 0)
        del runner
        gc.collect()
        free = psutil.virtual_memory().available
        init_free = free + proc.memory_info().rss
    return MemoryProfile(
        device=str(dev),
        model=loaded.name,
        dtype=str(loaded.dtype).removeprefix("torch."),
        max_num_batched_tokens=n,
        total_memory=int(total),
        weights_memory=int(weights),
        peak_activation_memory=int(peak),
        other_memory=int(other),
        process_memory=int(rss),
        seconds=time.perf_counter() - t0,
        init_free_memory=int(init_free),
        free_memory=int(free),
    )
