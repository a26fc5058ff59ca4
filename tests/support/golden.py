"""The golden file of a lesson or a case: ``golden.json`` in its folder
(``<content>/lessons/<id>/``, ``<content>/cases/<id>/``), what the tests pin about it.

- ``run`` (a lesson): its recorded run on the tiny model, as digests: the number of steps, the
  trace file's text and the player's payload in each language (tests/lab/test_recorded_runs.py);
- ``scenarios``: the scenario it plays for every combination of its switches' options and layer
  counts, keyed ``"<num_layers>|<overrides as JSON>"`` (tests/lab/test_lesson_data.py; they are the
  scenarios the Python lessons produced before lessons became data); a case's ``fixed_scenarios``
  are its fixed run's.

Rewrite them after a change that is meant to change them (say so in the commit):
``PAGED_KV_LAB_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/lab/test_recorded_runs.py
tests/lab/test_lesson_data.py``. A new lesson's file is written the same way.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from paged_kv_lab.text.i18n import content_dir

GOLDEN = "golden.json"
UPDATE_ENV = "PAGED_KV_LAB_UPDATE_GOLDEN"


def updating() -> bool:
    return bool(os.environ.get(UPDATE_ENV))


def golden_path(kind: str, item_id: str) -> Path:
    return content_dir() / kind / item_id / GOLDEN


def read_golden(kind: str, item_id: str) -> dict:
    path = golden_path(kind, item_id)
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def golden_text(data: dict) -> str:
    """The file's text: one part a line, each scenario on a line of its own (a change shows as
    the lines of the combinations it changes)."""
    parts = []
    for name, value in data.items():
        if name.endswith("scenarios"):
            lines = ",\n".join(
                f"  {json.dumps(k)}: {json.dumps(v, sort_keys=True, ensure_ascii=False)}"
                for k, v in sorted(value.items())
            )
            parts.append(f" {json.dumps(name)}: {{\n{lines}\n }}")
        else:
            parts.append(f" {json.dumps(name)}: {json.dumps(value, sort_keys=True)}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def write_golden(kind: str, item_id: str, **parts) -> None:
    """Set ``parts`` of the item's golden file (its other parts kept)."""
    data = {**read_golden(kind, item_id), **parts}
    order = ("run", "scenarios", "fixed_scenarios")
    data = {k: data[k] for k in sorted(data, key=lambda k: order.index(k) if k in order else 9)}
    golden_path(kind, item_id).write_text(golden_text(data), encoding="utf-8")
