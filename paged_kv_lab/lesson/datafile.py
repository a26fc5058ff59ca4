"""Reading the lab's data files (YAML, or JSON, which YAML reads too) into validated objects.

Every problem is reported as ``ValueError("<file>: <field path>: <what is wrong>")``, so a wrong
file names the file and the field (``myths.yaml: [2].sources.0.file: Field required``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import TypeAdapter, ValidationError

T = TypeVar("T")


def field_path(loc: tuple) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".") or "(top)"


def load(path: Path, schema: Any) -> Any:
    """The data of ``path`` validated as ``schema`` (a pydantic model or a type such as
    ``list[Model]``)."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"{path.name}: not a readable YAML file ({e})") from None
    try:
        return TypeAdapter(schema).validate_python(raw)
    except ValidationError as e:
        problems = "; ".join(f"{field_path(err['loc'])}: {err['msg']}" for err in e.errors())
        raise ValueError(f"{path.name}: {problems}") from None


def fail(path: Path, where: str, problem: str) -> ValueError:
    """A problem the schema cannot see (a key missing from the catalogue, say), worded as
    ``load``'s."""
    return ValueError(f"{path.name}: {where}: {problem}")
