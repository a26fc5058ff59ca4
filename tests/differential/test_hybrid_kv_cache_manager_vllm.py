"""Turning the hybrid KV cache manager off, as vLLM 0.34.0 does: which connectors support it
(kvcore/distributed/kv_transfer/kv_connector/factory.py against vLLM's own
``KVConnectorFactory.supports_hma_config``, for every connector vLLM registers and for
MultiConnectors), and what ``unify_hybrid_kv_cache_specs`` makes of each layout of layers
(kvcore/core/kv_cache_utils.py against vLLM's function of that name).

vLLM's side (tests/support/reference/vllm_hma.py) runs under the scratch vLLM 0.34.0 environment
(``bash scripts/vllm_env.sh``; ``VLLM_VENV`` names another place); skipped, with the reason,
where it is absent. Importing vLLM takes a while, so it is in the slow set.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from kvcore.core.kv_cache_planning import unify_hybrid_kv_cache_specs
from kvcore.distributed.kv_transfer.kv_connector.factory import (
    CONNECTOR_NAMES,
    KVConnectorFactory,
)
from kvcore.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec
from kvcore.kv_cache_interface import mamba as mamba_group
from support.paths import REFERENCE

pytestmark = pytest.mark.slow

VENV = Path(os.environ.get("VLLM_VENV", "/tmp/vllm034-venv"))
PYTHON = VENV / "bin" / "python"

LAYOUTS = [
    ["full", "sliding", "full", "sliding"],
    ["sliding", "sliding", "sliding", "full"],
    ["full", "full"],
    ["sliding", "sliding"],
    ["full", "mamba", "mamba"],
    ["full", "sliding", "mamba"],
    ["mamba", "mamba"],
]
MULTI = [
    ["OffloadingConnector", "NixlConnector"],
    ["OffloadingConnector", "LMCacheConnectorV1"],
    [],
]


def ours(kind: str):
    if kind == "full":
        return FullAttentionSpec(4)
    if kind == "sliding":
        return SlidingWindowSpec(4, 8)
    return mamba_group(4).kv_cache_spec


@pytest.fixture(scope="module")
def vllm_answers() -> dict:
    if not PYTHON.exists():
        pytest.skip(f"no vLLM 0.34.0 environment at {VENV} (bash scripts/vllm_env.sh)")
    done = subprocess.run(
        [str(PYTHON), str(REFERENCE / "vllm_hma.py")],
        input=json.dumps({"layouts": LAYOUTS, "multi": MULTI}),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_every_registered_connector_supports_hma_as_vllm_says(vllm_answers):
    theirs = vllm_answers["connectors"]
    assert set(theirs) | {"MultiConnector"} == set(CONNECTOR_NAMES), sorted(
        set(theirs) ^ (set(CONNECTOR_NAMES) - {"MultiConnector"})
    )
    mine = {name: KVConnectorFactory.supports_hma_config(name) for name in theirs}
    assert mine == theirs
    assert not all(theirs.values()) and any(theirs.values())  # both answers occur


def test_a_multiconnector_supports_hma_when_every_child_does(vllm_answers):
    mine = [KVConnectorFactory.supports_hma_config("MultiConnector", c) for c in MULTI]
    assert mine == vllm_answers["multi"] == [True, False, False]


def test_unify_makes_the_layouts_vllm_makes(vllm_answers):
    for layout, theirs in zip(LAYOUTS, vllm_answers["unified"]):
        specs = {f"layers.{i}": ours(k) for i, k in enumerate(layout)}
        try:
            unify_hybrid_kv_cache_specs(specs)
        except ValueError:
            assert theirs == "error", layout
            continue
        assert [[s.kind, s.block_size] for s in specs.values()] == theirs, layout
    # both answers occur: a layout made one kind, and the Mamba ones refused
    assert "error" in vllm_answers["unified"] and vllm_answers["unified"][0] != "error"
