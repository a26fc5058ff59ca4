"""vLLM 0.34.0's side of tests/differential/test_hybrid_kv_cache_manager_vllm.py, run by the vLLM
scratch environment's Python. Reads JSON on stdin: ``{"layouts": [[kind, ...], ...],
"multi": [[child, ...], ...]}`` (kinds "full", "sliding", "mamba"). Writes JSON:

- ``connectors``: every name vLLM's ``KVConnectorFactory`` registers -> whether vLLM's own
  ``KVConnectorFactory.supports_hma_config`` says it supports the hybrid KV cache manager (the
  class imported), or, where the class cannot be imported here (a third-party package missing),
  whether its class statement names ``SupportsHMA`` or a base of its module that does;
- ``multi``: the same for a MultiConnector of each list of children;
- ``unified``: for each layout (one spec per layer, in order), the kinds and block sizes after
  vLLM's own ``unify_hybrid_kv_cache_specs``, or ``"error"`` when it raises ValueError.
"""

import ast
import importlib.util
import inspect
import json
import sys
from pathlib import Path

import torch
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.v1.core import kv_cache_planning
from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec, SlidingWindowSpec

BLOCK_SIZE = 4


def spec(kind: str):
    if kind == "full":
        return FullAttentionSpec(
            block_size=BLOCK_SIZE, num_kv_heads=2, head_size=16, dtype=torch.float32
        )
    if kind == "sliding":
        return SlidingWindowSpec(
            block_size=BLOCK_SIZE,
            num_kv_heads=2,
            head_size=16,
            dtype=torch.float32,
            sliding_window=8,
        )
    return MambaSpec(
        block_size=BLOCK_SIZE, shapes=((1,),), dtypes=(torch.float32,), mamba_cache_mode="align"
    )


def kind_of(s) -> str:
    if isinstance(s, SlidingWindowSpec):
        return "sliding"
    if isinstance(s, FullAttentionSpec):
        return "full"
    if isinstance(s, MambaSpec):
        return "mamba"
    return type(s).__name__


def declared_in_source(module_path: str, class_name: str) -> bool:
    """Whether the class statement of ``class_name`` in ``module_path`` (a package: its files)
    names SupportsHMA, directly or through a base defined in the same place."""
    spec_ = importlib.util.find_spec(module_path)
    files = []
    if spec_.submodule_search_locations:
        for folder in spec_.submodule_search_locations:
            files += sorted(Path(folder).rglob("*.py"))
    else:
        files = [Path(spec_.origin)]
    bases: dict[str, list[str]] = {}
    for f in files:
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ClassDef):
                bases[node.name] = [ast.unparse(b).split(".")[-1] for b in node.bases]

    def has(name: str, seen=()) -> bool:
        if name == "SupportsHMA":
            return True
        return any(has(b, seen + (name,)) for b in bases.get(name, []) if b not in seen)

    return has(class_name)


def connector_support(name: str) -> bool:
    try:
        return KVConnectorFactory.supports_hma_config(
            KVTransferConfig(kv_connector=name, kv_role="kv_both")
        )
    except Exception:
        where = inspect.getclosurevars(KVConnectorFactory._registry[name]).nonlocals
        return declared_in_source(where["module_path"], where["class_name"])


def main() -> None:
    ask = json.load(sys.stdin)
    connectors = {
        name: connector_support(name)
        for name in sorted(KVConnectorFactory._registry)
        if name != "MultiConnector"
    }
    multi = []
    for children in ask["multi"]:
        config = KVTransferConfig(
            kv_connector="MultiConnector",
            kv_role="kv_both",
            kv_connector_extra_config={
                "connectors": [{"kv_connector": c, "kv_role": "kv_both"} for c in children]
            },
        )
        multi.append(KVConnectorFactory.supports_hma_config(config))
    unified = []
    for layout in ask["layouts"]:
        specs = {f"layers.{i}": spec(k) for i, k in enumerate(layout)}
        try:
            kv_cache_planning.unify_hybrid_kv_cache_specs(specs)
        except ValueError:
            unified.append("error")
            continue
        unified.append([[kind_of(s), s.block_size] for s in specs.values()])
    json.dump({"connectors": connectors, "multi": multi, "unified": unified}, sys.stdout)


if __name__ == "__main__":
    main()
