"""CPU-only speed work, opt-in and applied by one call each: the model's arithmetic is unchanged.

- :func:`pack_for_cpu` (the runner calls it on its private clone): every ``nn.Linear`` is
  swapped for a :class:`PackedLinear` that multiplies through weights pre-packed once for
  oneDNN, the q/k/v and gate/up siblings stacked into one weight (:class:`PackedWeights`).
  ``PAGED_KV_LAB_PACKED_WEIGHTS=0`` turns it off.
- :func:`use_input_major_weights` (the loader calls it on CPU models): each Linear weight is
  stored input-major, which MKL's sgemm multiplies faster for a decode step's few rows; it
  speeds up transformers' own ``generate`` too.  ``PAGED_KV_LAB_WEIGHT_LAYOUT=default`` turns
  it off.

Both only pay on the CPU in float32; elsewhere they leave the model as it is.
"""

from __future__ import annotations

import os
from typing import Sequence

import torch

PACKED_ENV = "PAGED_KV_LAB_PACKED_WEIGHTS"
# on a group's first weight: {ids of its weights: (packed, bias, sizes)}
_PACKED_ATTR = "_kvlab_onednn_packed"

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
        if any(
            w.device.type != "cpu"
            or w.dtype != torch.float32
            or w.dim() != 2
            or w.shape[1] != w0.shape[1]
            for w in weights
        ):
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
                    made = PackedWeights(
                        torch.ops.mkldnn._reorder_linear_weight(stacked, 8),
                        bias,
                        [int(w.shape[0]) for w in weights],
                    )
                    x = torch.randn(3, w0.shape[1], generator=torch.Generator().manual_seed(0))
                    got = made.multiply(x).split(made.sizes, dim=-1)
                    if not all(
                        torch.allclose(g, torch.nn.functional.linear(x, w, b), rtol=1e-4, atol=1e-4)
                        for g, w, b in zip(got, weights, biases)
                    ):
                        return None
            except (RuntimeError, AttributeError, NotImplementedError, TypeError):
                return None  # an older torch without these ops, or no oneDNN: keep the plain Linear
            shared[key] = (made.packed, made.bias, made.sizes)
            setattr(w0, _PACKED_ATTR, shared)
        # the packed tensor shared, the call state each runner's own
        return PackedWeights(*shared[key])


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

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None, group: PackedWeights, member: int = 0
    ):
        super().__init__()
        self.weight = weight
        self.bias = bias
        self.group = group
        self.member = member

    @staticmethod
    def try_build(linear: torch.nn.Module) -> "PackedLinear | None":
        """The packed twin of ``linear`` alone; None where packing does not apply."""
        group = PackedWeights.try_build([linear])
        return (
            None
            if group is None
            else PackedLinear(linear.weight, getattr(linear, "bias", None), group)
        )

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
        for names in SIBLING_PROJECTIONS if stack_siblings else ():
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


WEIGHT_LAYOUT_ENV = "PAGED_KV_LAB_WEIGHT_LAYOUT"


def use_input_major_weights(model) -> int:
    """Store every Linear weight input-major (as ``W.t().contiguous().t()``); same values.

    ``nn.Linear`` computes ``x @ W.T``.  With the usual ``[out, in]`` row-major W, MKL's
    sgemm takes a transposed-B path that, for the small M of decoding (2-40 rows), costs
    about 2x what the plain path costs when ``W.T`` is itself contiguous (measured on this
    project's 2-core CPU: per SmolLM2 layer 1.9 ms -> 0.9 ms at 8 rows, unchanged at 1 row).
    Tied weights stay tied (the embedding then gathers strided rows, which is cheap).
    The price: the weights become a private copy (538 MB for SmolLM2) instead of pages of
    the memory-mapped safetensors file.  Only worth it on the CPU;
    ``PAGED_KV_LAB_WEIGHT_LAYOUT=default`` turns it off.
    Float32 weights only: half-precision ones stay row-major.
    Returns the number of weight tensors re-laid out.
    """
    if os.environ.get(WEIGHT_LAYOUT_ENV, "") == "default":
        return 0
    replaced: dict[int, torch.nn.Parameter] = {}
    count = 0
    with torch.no_grad():
        for module in model.modules():
            if not isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
                continue
            w = module.weight
            if id(w) not in replaced:
                if isinstance(module, torch.nn.Embedding) and not any(
                    m.weight is w for m in model.modules() if isinstance(m, torch.nn.Linear)
                ):
                    continue  # an untied embedding: leave it row-major
                if w.dim() != 2 or not w.is_contiguous() or w.dtype != torch.float32:
                    # bfloat16 / float16: CPUs without native half matmuls (AVX2) multiply an
                    # input-major weight ~7x slower than a row-major one (SmolLM2 in bfloat16:
                    # 6.0 s against 0.7 s for one forward of 21 tokens)
                    replaced[id(w)] = w
                    continue
                replaced[id(w)] = torch.nn.Parameter(
                    w.detach().t().contiguous().t(), requires_grad=False
                )
                count += 1
            module.weight = replaced[id(w)]
    return count


def pack_for_cpu(model: torch.nn.Module) -> int:
    """The runner's one call: pre-pack ``model``'s linear layers for oneDNN where that applies
    (CPU, float32, oneDNN present, not turned off); returns how many layers were swapped."""
    if os.environ.get(PACKED_ENV, "1") == "0":
        return 0
    return pack_linear_layers(model)
