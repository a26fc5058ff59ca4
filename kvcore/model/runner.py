"""ModelRunner: run one engine step -- all scheduled sequences in ONE packed forward.

The engine hands a list of :class:`SeqBatchItem` (which tokens to feed, from which
position, through which block tables); the runner packs the tokens of all sequences
along one axis (batch dimension 1, explicit position ids), lets every decoder layer
write and read K/V through the paged pools (:mod:`kvcore.model.paged_attention`), and
computes logits only at the last token of the sequences that sample this step.
On the CPU in float32 the runner's linear layers multiply through weights pre-packed
once for oneDNN (:class:`PackedLinear`); everything else is transformers' own code.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from typing import Sequence

import torch

from .loader import LoadedModel
from .reference import shared_clone
from .paged_attention import ATTN_NAME, PagedStep, build_paged_step, pool_views_of

try:  # the engine's own definition, when present (same fields)
    from kvcore.batch import SeqBatchItem  # type: ignore
except ImportError:  # pragma: no cover - kvcore.batch is written by the engine side
    @dataclass(frozen=True)
    class SeqBatchItem:  # type: ignore[no-redef]
        request_id: str
        token_ids: list[int]                 # tokens fed this step (prompt chunk, or the last sampled token)
        start_pos: int                       # position of token_ids[0] = tokens already in the pool
        block_tables: tuple[list[int], ...]  # per KV cache group: logical block -> physical block (0 = null)
        sample: bool                         # this step completes the known tokens: sample the next one


PACKED_ENV = "PAGED_KV_LAB_PACKED_WEIGHTS"
_PACKED_ATTR = "_kvlab_onednn_packed"  # on a group's first weight: {ids of its weights: (packed, bias, sizes)}

# Sibling projections that Llama-family layers multiply by the same input, stacked into one
# packed weight (vLLM's QKVParallelLinear and MergedColumnParallelLinear stack the same ones).
SIBLING_PROJECTIONS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class PackedWeights:
    """One or more linear layers' weights, stacked along the output and pre-packed once for
    oneDNN (CPU, float32): one multiplication gives every member's output.

    Invariant: ``parts`` is the product of ``source`` -- that very tensor object -- with the
    stacked weights, and each member takes its slice of it at most once; a member called with
    another input, or a second time, multiplies anew.  So stacking saves work when the
    decoder layer calls the siblings on one input (as Llama's q/k/v and gate/up are), and
    can never hand a member a stale or foreign result when it does not.
    """

    def __init__(self, packed: torch.Tensor, bias: torch.Tensor | None, sizes: list[int]):
        self.packed = packed
        self.bias = bias
        self.sizes = sizes
        self.source: torch.Tensor | None = None
        self.parts: tuple[torch.Tensor, ...] = ()
        self.served: set[int] = set()

    def multiply(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def output(self, x: torch.Tensor, member: int) -> torch.Tensor:
        if len(self.sizes) == 1:
            return self.multiply(x)
        if self.source is not x or member in self.served:
            self.parts = self.multiply(x).split(self.sizes, dim=-1)
            self.source, self.served = x, set()
        self.served.add(member)
        out = self.parts[member]
        if len(self.served) == len(self.sizes):  # all taken: hold no activations between steps
            self.source, self.parts = None, ()
        return out

    @staticmethod
    def try_build(linears: Sequence[torch.nn.Module]) -> "PackedWeights | None":
        """The packed stack of ``linears`` (shared by every runner on those weights); None where
        packing does not apply or its result fails the check against ``F.linear``."""
        if os.environ.get(PACKED_ENV, "1") == "0":
            return None
        weights = [lin.weight for lin in linears]
        biases = [getattr(lin, "bias", None) for lin in linears]
        w0 = weights[0]
        if any(w.device.type != "cpu" or w.dtype != torch.float32 or w.dim() != 2
               or w.shape[1] != w0.shape[1] for w in weights):
            return None
        if any(b is None for b in biases) and any(b is not None for b in biases):
            return None
        key = tuple(id(w) for w in weights)
        shared = getattr(w0, _PACKED_ATTR, None) or {}
        if key not in shared:
            try:
                if not torch.backends.mkldnn.is_available():
                    return None
                with torch.inference_mode():
                    stacked = torch.cat([w.detach() for w in weights]).contiguous()
                    bias = None if biases[0] is None else torch.cat([b.detach() for b in biases])
                    made = PackedWeights(torch.ops.mkldnn._reorder_linear_weight(stacked, 8), bias,
                                         [int(w.shape[0]) for w in weights])
                    x = torch.randn(3, w0.shape[1], generator=torch.Generator().manual_seed(0))
                    got = made.multiply(x).split(made.sizes, dim=-1)
                    if not all(torch.allclose(g, torch.nn.functional.linear(x, w, b), rtol=1e-4, atol=1e-4)
                               for g, w, b in zip(got, weights, biases)):
                        return None
            except (RuntimeError, AttributeError, NotImplementedError, TypeError):
                return None  # an older torch without these ops, or no oneDNN: keep the plain Linear
            shared[key] = (made.packed, made.bias, made.sizes)
            setattr(w0, _PACKED_ATTR, shared)
        return PackedWeights(*shared[key])  # the packed tensor shared, the call state each runner's own


class PackedLinear(torch.nn.Module):
    """A ``Linear`` that multiplies through oneDNN-packed weights: same math, and the same
    weight tensor (``weight``) as the layer it stands in for.

    ``nn.Linear`` hands each call to MKL's sgemm, which re-packs the whole weight on every
    call; for the 2-40 rows of a decode step that repacking, not the arithmetic, is most of
    the cost.  Reordering each weight once into oneDNN's blocked layout (what vLLM's CPU
    backend does for its linear layers too) cut SmolLM2's 210 layer matmuls at 8 rows from
    about 66 to 41-48 ms and its 49,152-row output projection from about 28 to 11 ms on this
    project's 2-core CPU; a one-row step (batch 1) gains a few per cent too.  Each oneDNN
    call also costs ~25 us of set-up, so siblings that multiply one input (q/k/v, gate/up)
    share one stacked weight (:class:`PackedWeights`): 121 calls a step instead of 211.
    The decoder layers' own code is unchanged: only the module that multiplies differs.
    ``PAGED_KV_LAB_PACKED_WEIGHTS=0`` turns packing off.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, group: PackedWeights,
                 member: int = 0):
        super().__init__()
        self.weight = weight
        self.bias = bias
        self.group = group
        self.member = member

    @staticmethod
    def try_build(linear: torch.nn.Module) -> "PackedLinear | None":
        """The packed twin of ``linear`` alone; None where packing does not apply."""
        group = PackedWeights.try_build([linear])
        return None if group is None else PackedLinear(linear.weight, getattr(linear, "bias", None), group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.output(x, self.member)


def pack_linear_layers(model: torch.nn.Module, stack_siblings: bool = True) -> int:
    """Swap every ``nn.Linear`` of ``model`` (in place) for a :class:`PackedLinear`, the
    :data:`SIBLING_PROJECTIONS` of each module sharing one stacked weight (unless
    ``stack_siblings`` is False).  Meant for a runner's private clone; returns how many
    layers were swapped."""
    plan: list[tuple[torch.nn.Module, list[str]]] = []
    for parent in model.modules():
        linear = {n for n, c in parent.named_children() if isinstance(c, torch.nn.Linear)}
        for names in (SIBLING_PROJECTIONS if stack_siblings else ()):
            if linear.issuperset(names):
                plan.append((parent, list(names)))
                linear -= set(names)
        plan += [(parent, [n]) for n in sorted(linear)]
    count = 0
    for parent, names in plan:
        linears = [getattr(parent, n) for n in names]
        group = PackedWeights.try_build(linears)
        if group is not None:
            members = [(group, i) for i in range(len(names))]
        elif len(names) > 1:  # stacking refused (shapes, a bias mix): each on its own
            members = [(PackedWeights.try_build([lin]), 0) for lin in linears]
        else:
            continue
        for n, lin, (g, i) in zip(names, linears, members):
            if g is not None:
                setattr(parent, n, PackedLinear(lin.weight, getattr(lin, "bias", None), g, i))
                count += 1
    return count


class ModelRunner:
    """Owns the paged KV pools (one tensor per decoder layer) and runs steps.

    layer_group[i]: the KV cache group decoder layer i reads/writes through.
    group_sliding_window[g]: None = full attention, W = sliding window of W tokens.
    seed: None = greedy (argmax, ties -> lowest id); an int = sampling at temperature 1
    from a torch.Generator seeded once here (same steps -> same tokens).

    The runner works on a shallow clone of ``loaded.model`` that shares every weight
    tensor but has its own config, switched to the paged attention; ``loaded.model``
    itself is left untouched (it keeps its sdpa attention and plain ``nn.Linear`` layers
    for ``generate``).
    """

    def __init__(
        self,
        loaded: LoadedModel,
        num_blocks: int,
        block_size: int,
        layer_group: Sequence[int] | None = None,
        group_sliding_window: Sequence[int | None] | None = None,
        seed: int | None = None,
    ) -> None:
        cfg = loaded.config
        n_layers = int(cfg.num_hidden_layers)
        if layer_group is None:
            layer_group = [0] * n_layers
        if group_sliding_window is None:
            group_sliding_window = [None]
        layer_group = [int(g) for g in layer_group]
        group_sliding_window = [None if w is None else int(w) for w in group_sliding_window]
        if len(layer_group) != n_layers:
            raise ValueError(f"layer_group has {len(layer_group)} entries; the model has {n_layers} layers")
        if any(g < 0 or g >= len(group_sliding_window) for g in layer_group):
            raise ValueError(f"layer_group {layer_group} names a group beyond {len(group_sliding_window)} groups")
        if any(w is not None and w < 1 for w in group_sliding_window):
            raise ValueError(f"sliding windows must be >= 1: {group_sliding_window}")
        if num_blocks < 2:
            raise ValueError("num_blocks must be >= 2 (block 0 is the null block)")
        if block_size < 1:
            raise ValueError("block_size must be >= 1")

        self.loaded = loaded
        self.num_blocks = int(num_blocks)
        self.block_size = int(block_size)
        self.layer_group = layer_group
        self.group_sliding_window = group_sliding_window
        self.seed = seed
        self.device = loaded.device
        self.dtype = loaded.dtype
        self.num_layers = n_layers
        self.num_kv_heads = int(cfg.num_key_value_heads)
        self.num_heads = int(cfg.num_attention_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        self.vocab_size = int(cfg.vocab_size)

        self.model = shared_clone(loaded.model)
        self.model.set_attn_implementation(ATTN_NAME)
        self.model.eval()
        self.num_packed_layers = pack_linear_layers(self.model)  # only in the runner's clone

        shape = (self.num_blocks, 2, self.num_kv_heads, self.block_size, self.head_dim)
        with torch.inference_mode():
            self.kv_caches: list[torch.Tensor] = [
                torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(n_layers)
            ]
        self._pool_views = pool_views_of(self.kv_caches)
        self._generator: torch.Generator | None = None
        if seed is not None:
            self._generator = torch.Generator(device=self.device)
            self._generator.manual_seed(int(seed))
        self.last_step: PagedStep | None = None  # for displays/tests: what the last step gathered

    # ------------------------------------------------------------------ info
    @property
    def kv_cache_shape(self) -> tuple[int, ...]:
        return tuple(self.kv_caches[0].shape)

    @property
    def kv_cache_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.kv_caches)

    def read_block(self, layer: int, block_id: int) -> torch.Tensor:
        """A copy of one block of one layer: [2 (K,V), num_kv_heads, block_size, head_dim]."""
        return self.kv_caches[layer][block_id].detach().clone()

    # ------------------------------------------------------------------ steps
    def _forward(self, items: Sequence[SeqBatchItem]) -> tuple[list[str], torch.Tensor | None]:
        for it in items:
            if len(it.token_ids) == 0:
                raise ValueError(f"request {it.request_id!r}: no tokens to feed")
            if it.start_pos < 0:
                raise ValueError(f"request {it.request_id!r}: negative start_pos")
            if len(it.block_tables) != len(self.group_sliding_window):
                raise ValueError(
                    f"request {it.request_id!r}: {len(it.block_tables)} block tables for "
                    f"{len(self.group_sliding_window)} KV cache groups"
                )
        if len({it.request_id for it in items}) != len(items):
            raise ValueError("a request appears twice in one step")
        counts = [len(it.token_ids) for it in items]
        starts = [int(it.start_pos) for it in items]
        step = build_paged_step(
            counts, starts, [it.block_tables for it in items], [it.request_id for it in items],
            self.group_sliding_window, self.kv_caches, self.layer_group, self.block_size,
            self.num_blocks, self.num_kv_heads, self.num_heads // self.num_kv_heads, self.device,
            self.dtype, self._pool_views,
        )
        self.last_step = step
        ids = list(itertools.chain.from_iterable(it.token_ids for it in items))
        pos = list(itertools.chain.from_iterable(range(s, s + n) for s, n in zip(starts, counts)))
        keep, rids, end = [], [], 0
        for it, n in zip(items, counts):
            end += n
            if it.sample:
                keep.append(end - 1)
                rids.append(it.request_id)
        dev = self.device
        input_ids = torch.tensor([ids], dtype=torch.long).to(dev)
        position_ids = torch.tensor([pos], dtype=torch.long).to(dev)
        logits_to_keep = torch.tensor(keep, dtype=torch.long).to(dev)
        out = self.model(
            input_ids=input_ids,
            position_ids=position_ids,
            use_cache=False,
            logits_to_keep=logits_to_keep,
            paged_step=step,
        )
        return rids, (out.logits[0] if rids else None)

    @torch.inference_mode()
    def execute_logits(self, items: Sequence[SeqBatchItem]) -> dict[str, torch.Tensor]:
        """Run one step; last-position logits (float32, CPU, [vocab]) of each item with sample=True."""
        if not items:
            return {}
        rids, logits = self._forward(items)
        if logits is None:
            return {}
        logits = logits.float().cpu()
        return {r: logits[i].clone() for i, r in enumerate(rids)}

    @torch.inference_mode()
    def execute(self, items: Sequence[SeqBatchItem]) -> dict[str, int]:
        """Run one step; the next token of each item with sample=True."""
        if not items:
            return {}
        rids, logits = self._forward(items)
        if logits is None:
            return {}
        if self._generator is None:
            next_ids = torch.argmax(logits, dim=-1)
        else:
            probs = torch.softmax(logits.float(), dim=-1)
            next_ids = torch.multinomial(probs, 1, generator=self._generator)[:, 0]
        return dict(zip(rids, next_ids.tolist()))
