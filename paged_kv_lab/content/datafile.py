"""Reading the lab's data files (YAML, or JSON, which YAML reads too) into validated objects.

Every problem is reported as a ``DataFileError`` (a ValueError) whose lines read
``<file>: <field path>: <what is wrong>``, so a wrong file names the file and the field
(``.../myths.yaml: [2].sources.0.file: Field required``). The one reader for lessons, cases,
myths and the quiz."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence, TypeVar

import yaml
from pydantic import TypeAdapter, ValidationError

T = TypeVar("T")


class DataFileError(ValueError):
    """A data file that cannot be loaded; each problem names the file and the field."""

    def __init__(self, path: Path | str, problems: Sequence[str]) -> None:
        self.path, self.problems = Path(path), list(problems)
        super().__init__("\n".join(f"{path}: {p}" for p in self.problems))


def field_path(loc: tuple) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".") or "(top)"


def load(path: Path, schema: Any) -> Any:
    """The data of ``path`` validated as ``schema`` (a pydantic model or a type such as
    ``list[Model]``)."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        where = " ".join(str(e).split())  # PyYAML's message spans lines
        raise DataFileError(path, [f"not a readable YAML file ({where})"]) from None
    try:
        return TypeAdapter(schema).validate_python(raw)
    except ValidationError as e:
        raise DataFileError(
            path, [f"{field_path(err['loc'])}: {err['msg']}" for err in e.errors()]
        ) from None


def fail(path: Path, where: str, problem: str) -> DataFileError:
    """A problem the schema cannot see (a key missing from the catalogue, say), worded as
    ``load``'s."""
    return DataFileError(path, [f"{where}: {problem}"])
