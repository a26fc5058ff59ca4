"""The page arithmetic of hybrid models, for the hybrid-models lesson: the loaded tiny-hybrid and
the real models of ``hybrid_models.yaml`` (their configs' shapes), each computed by kvcore's
``hybrid_page_sizes`` (vLLM's ``_align_hybrid_block_size``), nothing written in."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, StrictInt, StrictStr

from kvcore.model.memory import HybridPageSizes, hybrid_page_sizes, num_linear_layers
from paged_kv_lab.content.datafile import load

MODELS_FILE = Path(__file__).resolve().parent / "hybrid_models.yaml"


class HybridModelData(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: StrictStr
    source: StrictStr
    dtype: StrictStr
    ssm_dtype: Optional[StrictStr] = None
    config: dict[StrictStr, StrictInt]


@dataclass(frozen=True)
class HybridRow:
    """One model's pages: ``sizes`` per layer, and what one cached state costs, a state page in
    every linear layer (which states align mode keeps: prefix_cache_retention_interval's)."""

    name: str
    source: Optional[str]
    sizes: HybridPageSizes
    linear_layers: int

    @property
    def cached_state_bytes(self) -> int:
        return self.linear_layers * self.sizes.page_bytes


def row(name: str, config: Any, dtype: Any, ssm_dtype: Any = None, source: Optional[str] = None):
    return HybridRow(
        name, source, hybrid_page_sizes(config, dtype, ssm_dtype), num_linear_layers(config)
    )


@lru_cache(maxsize=1)
def real_models() -> tuple[HybridRow, ...]:
    """The rows of ``hybrid_models.yaml``, in its order."""
    return tuple(
        row(m.name, SimpleNamespace(**m.config), m.dtype, m.ssm_dtype, m.source)
        for m in load(MODELS_FILE, list[HybridModelData])
    )


def hybrid_rows(name: str, config: Any, dtype: Any) -> tuple[HybridRow, ...]:
    """The loaded model's row (its own config and dtype) and the real models'."""
    return (row(name, config, str(dtype).removeprefix("torch.")), *real_models())
