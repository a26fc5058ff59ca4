"""Where a multimodal item sits in a prompt, as the block manager sees it (vLLM:
multimodal/inputs.py).

The prompt holds ``length`` placeholder tokens from ``offset`` for each item (an image, an
audio clip); the item's content hash (``identifier``) goes into the extra keys of every block
that range touches, with the offset relative to that block's start, so two prompts with the
same placeholder tokens but different images never share those blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class PlaceholderRange:
    """Invariant: ``offset >= 0`` and ``length >= 1``."""

    offset: int
    length: int

    def __post_init__(self) -> None:
        if self.offset < 0 or self.length < 1:
            raise ValueError(f"a placeholder range needs offset >= 0 and length >= 1: {self}")


@dataclass(frozen=True)
class MultiModalFeatureSpec:
    """One multimodal item of a request; a request's items are sorted by offset."""

    identifier: str
    mm_position: PlaceholderRange
    modality: str = "image"
    data: Optional[object] = None
