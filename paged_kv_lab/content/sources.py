"""Where a sentence about vLLM, SGLang or nano-vllm comes from: a file of that engine and a
function, class or setting in it, at the version the lab models (vLLM 0.34.0, SGLang 0.5.23,
nano-vllm at the commit the designs page names).

One shape, ``Source``, for every data file that cites one: a myth's ``sources`` (``myths.yaml``),
a case's ``sources`` (``cases/<id>/case.yaml``, for its answer), a moment's ``sources`` (a
lesson's or a case's ``moments``), and the topic pages' sentences, whose data is each topic
folder's ``sources.yaml`` (``<content>/topics/<id>/``: catalogue key -> sources), since a topic's
page is code. tests/lab/test_sources.py checks that each
cited name is there in the engine's own source, where that source is installed."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field

from paged_kv_lab.content.datafile import fail, load
from paged_kv_lab.text.i18n import content_dir

TOPIC_SOURCES_FILE = "sources.yaml"  # in a topic's folder (<content>/topics/<id>/)

# the engines a source may name, by the first part of its path: the version the lab models
ENGINES = {"vllm": "vLLM 0.34.0", "sglang": "SGLang 0.5.23", "nanovllm": "nano-vllm"}


class Source(BaseModel):
    """A file of the engine (its own path: ``vllm/...``, ``sglang/...``, ``nanovllm/...``) and a
    name in it: a function, a class, ``Class.method`` or a setting; ``commit``: for nano-vllm, the
    commit it is read at (the designs page's modelled one when none is given)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    file: str = Field(pattern=r"^(vllm|sglang|nanovllm)/[\w/]+\.py$")
    name: str = Field(pattern=r"^\w+(\.\w+)?$")
    commit: Optional[str] = Field(default=None, pattern=r"^[0-9a-f]{7,40}$")

    @property
    def engine(self) -> str:
        return self.file.split("/", 1)[0]


class SourcedKey(BaseModel):
    """A catalogue sentence and where what it says is decided."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    key: str = Field(pattern=r"^[\w.-]+$")
    sources: tuple[Source, ...] = Field(min_length=1)


def load_sourced_keys(path: Path) -> tuple[SourcedKey, ...]:
    """The entries of ``path``; a repeated key or one the catalogue lacks is a DataFileError."""
    from paged_kv_lab.text.i18n import catalogue

    entries = tuple(load(path, list[SourcedKey]))
    keys, seen = catalogue(), set()
    for i, e in enumerate(entries):
        if e.key in seen:
            raise fail(path, f"[{i}].key", f"{e.key!r} is repeated")
        if e.key not in keys:
            raise fail(path, f"[{i}].key", f"the catalogue has no {e.key!r}")
        seen.add(e.key)
    return entries


@lru_cache(maxsize=4)
def _topic_sources(root: Path) -> dict[str, tuple[Source, ...]]:
    out: dict[str, tuple[Source, ...]] = {}
    for path in sorted((root / "topics").glob(f"*/{TOPIC_SOURCES_FILE}")):
        for i, e in enumerate(load_sourced_keys(path)):
            if e.key in out:
                raise fail(path, f"[{i}].key", f"{e.key!r} is also in another topic's file")
            out[e.key] = e.sources
    return out


def topic_sources() -> dict[str, tuple[Source, ...]]:
    """Topic sentence key -> its sources (every topic folder's ``sources.yaml``)."""
    return _topic_sources(content_dir())
