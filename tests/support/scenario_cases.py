"""Every setting of the scenario schema at its limits, generated from the schema itself.

The walk reads run/scenario.py's dataclasses (their ``Annotated`` bounds: ``ge``, ``gt``,
``le``, ``lt``, ``min_length``, Literal choices, Optional) and the budget's per-setting limits
(run/budget.py: ``SETTING_LIMITS``), so a field added to the schema gets its cases without a
word here. Each case is one value at one path of a valid base scenario (the playground's): the
schema's minimum and maximum and one past each, the budget's limit and one past it, null where
null is allowed, each choice of a Literal, a wrong type, and for a bound the schema leaves open
an absurd value. ``expect`` says what the schema alone makes of it: "refused" (the schema cannot
accept it), "valid" (the schema accepts the value itself; the budget or a rule between fields
may still refuse the whole scenario, by name) or "either" (a class that checks its fields in
``__post_init__`` decides).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from paged_kv_lab.run.budget import SETTING_LIMITS, Limits
from paged_kv_lab.run.scenario import Scenario

ABSURD_INT = 2**70  # past any machine integer
ABSURD_TEXT = "<b>ab</b>\n中文 &amp; " * 6_000  # ~ 100k characters of markup and newlines
ABSURD_LEN = 10_000  # items of a list the schema leaves unbounded


BOUNDED = ("below min", "above max", "too short", "item below min")


@dataclass(frozen=True)
class Case:
    path: tuple  # ("engine", "block_size"), ("requests", 0, "max_tokens"), ("name",), ...
    value: Any
    what: str  # "min", "below min", "max", "above max", "budget", "over budget", "null", ...
    expect: str  # "valid" or "refused" by the schema alone; "either": a class's own code decides
    limit: str | None = None  # budget / over budget: the Limits field (run/budget.py)

    @property
    def where(self) -> str:
        """The path as the app's messages write it: requests[0].max_tokens."""
        out = ""
        for p in self.path:
            out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else p)
        return out

    @property
    def id(self) -> str:
        return f"{self.where}={self.what}"

    def scenario(self, base: dict) -> dict:
        """``base`` with this case's value put at its path (a request's prompt and token ids
        swapped so that exactly one is given)."""
        d = copy.deepcopy(base)
        d["name"] = f"edge {self.id}"
        *parents, leaf = self.path
        at = d
        for p in parents:
            if isinstance(at, dict) and at.get(p) is None:
                at[p] = {}
            at = at[p]
        at[leaf] = self.value
        if self.path[:1] == ("requests",) and len(self.path) == 3:
            if leaf == "prompt_token_ids" and self.value is not None:
                at.pop("prompt", None)
        return d

    def shown(self) -> Any:
        """The value as the validated scenario holds it (lists as tuples, nested)."""

        def tup(v):
            return tuple(tup(x) for x in v) if isinstance(v, list) else v

        return tup(self.value)


def _bounds(meta: tuple) -> dict:
    out = {}
    for m in meta:
        for c in [m, *getattr(m, "metadata", ())]:
            for k in ("ge", "gt", "le", "lt", "min_length", "max_length"):
                if getattr(c, k, None) is not None:
                    out[k] = getattr(c, k)
    return out


def _unwrap(tp: Any) -> tuple[Any, dict]:
    """(bare type, bounds) of an ``Annotated`` type."""
    bounds = {}
    while get_origin(tp) is typing.Annotated:
        bounds.update(_bounds(tp.__metadata__))
        tp = tp.__origin__
    return tp, bounds


def _members(tp: Any) -> list[tuple[Any, dict]]:
    tp, bounds = _unwrap(tp)
    if get_origin(tp) in (Union, types.UnionType):
        out = []
        for a in get_args(tp):
            for bare, b in _members(a):
                out.append((bare, {**bounds, **b}))
        return out
    return [(tp, bounds)]


def _is_int(tp: Any) -> bool:
    return tp is int or getattr(tp, "__origin__", None) is int or _name(tp) == "StrictInt"


def _name(tp: Any) -> str:
    return getattr(tp, "__name__", "") or str(tp)


def _bare(tp: Any) -> Any:
    """StrictInt -> int, StrictStr -> str, ... (pydantic's strict types are Annotated)."""
    tp, _ = _unwrap(tp)
    return tp


def _number_cases(path, bounds, is_int: bool, budget: int | None, limit: str | None):
    out = []
    lo = bounds.get("ge", bounds.get("gt"))
    hi = bounds.get("le", bounds.get("lt"))
    step = (lambda v, d: v + d) if is_int else (lambda v, d: math.nextafter(v, v + d))
    if lo is not None:
        first = lo if "ge" in bounds else step(lo, 1)
        out += [
            Case(path, first, "min", "valid"),
            Case(path, step(first, -1), "below min", "refused"),
        ]
    else:
        out.append(Case(path, -ABSURD_INT if is_int else -1e300, "absurd low", "valid"))
    if hi is not None:
        last = hi if "le" in bounds else step(hi, -1)
        out += [Case(path, last, "max", "valid"), Case(path, step(last, 1), "above max", "refused")]
    else:
        out.append(Case(path, ABSURD_INT if is_int else 1e300, "absurd high", "valid"))
    if budget is not None:
        out += [
            Case(path, budget, "budget", "valid", limit),
            Case(path, budget + 1, "over budget", "valid", limit),
        ]
    return out


def _budget(path: tuple, limits: Limits, base: dict) -> tuple[int | None, str | None]:
    """The largest value the budget lets this path take in ``base`` (and its Limits field)."""
    key = tuple("[]" if isinstance(p, int) else p for p in path)
    field = SETTING_LIMITS.get(key)
    if field is None:
        return None, None
    most = getattr(limits, field)
    if key == ("requests", "[]", "n"):  # the other requests count against the same limit
        most -= sum(r.get("n", 1) for r in base["requests"][1:])
    if key == ("requests", "[]", "arrival_step"):  # arrives before the last step a run computes
        most -= 1
    return most, field


def _leaf_cases(path: tuple, tp: Any, limits: Limits, base: dict) -> list[Case]:
    out: list[Case] = []
    members = _members(tp)
    budget, limit = _budget(path, limits, base)
    kinds = [_bare(m) for m, _ in members]
    for m, bounds in members:
        bare = _bare(m)
        if bare is type(None):
            out.append(Case(path, None, "null", "valid"))
        elif get_origin(bare) is Literal:
            out += [Case(path, v, f"choice {v}", "valid") for v in get_args(bare)]
        elif bare is bool:
            out += [Case(path, True, "true", "valid"), Case(path, False, "false", "valid")]
        elif _is_int(bare) or bare is int:
            out += _number_cases(path, bounds, True, budget, limit)
        elif bare is float:  # a number in a range: its float edges (next to the int ones)
            out += _number_cases(path, bounds, False, None, None)
        elif bare is str:
            lo = bounds.get("min_length", 0)
            out.append(Case(path, "x" * lo, "shortest", "valid"))
            if lo:
                out.append(Case(path, "x" * (lo - 1), "too short", "refused"))
            if budget is not None:  # a prompt: its length is what the budget bounds
                out += [
                    Case(path, "x" * budget, "budget", "valid", limit),
                    Case(path, "x" * (budget + 1), "over budget", "valid", limit),
                ]
            else:
                out.append(Case(path, ABSURD_TEXT, "absurd long", "valid"))
        elif get_origin(bare) is tuple:
            item = get_args(bare)[0]
            lo = bounds.get("min_length", 0)
            sample = _sample(item)
            out.append(Case(path, [sample] * lo, "shortest", "valid"))
            if lo:
                out.append(Case(path, [], "too short", "refused"))
            if budget is not None:
                out += [
                    Case(path, [sample] * budget, "budget", "valid", limit),
                    Case(path, [sample] * (budget + 1), "over budget", "valid", limit),
                ]
            else:
                out.append(Case(path, [sample] * ABSURD_LEN, "absurd long", "valid"))
            for c in _leaf_cases(path + (0,), item, limits, base):  # the items' own limits
                if c.value is not None and not isinstance(c.value, (list, str)):
                    out.append(Case(path, [c.value], f"item {c.what}", c.expect))
        elif dataclasses.is_dataclass(bare):
            out.append(Case(path, "not an object", "not an object", "refused"))
        elif get_origin(bare) is dict:  # a mapping: empty is its default; a list is no mapping
            out.append(Case(path, {}, "empty", "valid"))
            out.append(Case(path, ["not", "an", "object"], "not an object", "refused"))
        else:
            raise TypeError(
                f"{path}: no cases for the type {bare!r}: teach tests/support/scenario_cases.py"
            )
    if not any(k is str for k in kinds) and not any(get_origin(k) is Literal for k in kinds):
        out.append(Case(path, "7", "a string", "refused"))  # a careless quote
    elif any(get_origin(k) is Literal for k in kinds) and str not in kinds:
        out.append(Case(path, "no such choice", "not a choice", "refused"))
    return out


def _sample(item: Any) -> Any:
    bare = _bare(_members(item)[0][0])
    if get_origin(bare) is Literal:
        return get_args(bare)[0]
    bounds = _members(item)[0][1]
    return bounds.get("ge", 1) if _is_int(bare) else "x"


def _dataclass_of(tp: Any) -> Any:
    found = [_bare(m) for m, _ in _members(tp) if dataclasses.is_dataclass(_bare(m))]
    return found[0] if found else None


def cases(base: dict, limits: Limits | None = None) -> list[Case]:
    """Every field of the schema (Scenario, its engine, a request, the nested configs)."""
    limits = limits or Limits()
    out: list[Case] = []

    def walk(cls, path: tuple) -> None:
        hints = get_type_hints(cls, include_extras=True)
        for f in dataclasses.fields(cls):
            tp = hints[f.name]
            p = path + (f.name,)
            inner = _dataclass_of(tp)
            if p == ("requests",):
                walk(inner_request(tp), ("requests", 0))
                out.extend(_request_list_cases(p, limits, base))
                continue
            if inner is not None:
                walk(inner, p)
            found = _leaf_cases(p, tp, limits, base)
            if "__post_init__" in vars(cls):
                # the class checks more in code than its annotations say: only the declared
                # bounds tell what it refuses
                found = [
                    c if c.what in BOUNDED else dataclasses.replace(c, expect="either")
                    for c in found
                ]
            out.extend(found)

    walk(Scenario, ())
    seen, unique = set(), []
    for c in out:  # an int-or-float setting gives some values twice
        key = (c.path, type(c.value).__name__, repr(c.value)[:200], len(repr(c.value)))
        if key not in seen:
            seen.add(key)
            unique.append(c)
    return unique


def inner_request(tp: Any) -> Any:
    return get_args(_bare(tp))[0]


def _request_list_cases(path: tuple, limits: Limits, base: dict) -> list[Case]:
    def many(k: int) -> list[dict]:
        first = base["requests"][0]
        return [{**first, "id": f"R{i}", "arrival_step": 0} for i in range(k)]

    most = limits.max_requests
    return [
        Case(path, [], "none", "valid"),
        Case(path, many(most), "budget", "valid", "max_requests"),
        Case(path, many(most + 1), "over budget", "valid", "max_requests"),
        Case(path, "not a list", "not a list", "refused"),
    ]


def extremes(all_cases: list[Case]) -> list[Case]:
    """One case per field, its most extreme accepted value (the last the walk made), and every
    case over a budget limit: the cases a second way in must also carry."""

    def rank(c: Case) -> int:
        if c.what in ("max", "budget", "absurd high", "absurd long"):
            return 2
        return 0 if c.what in ("null", "a string", "not a choice", "not an object") else 1

    last: dict[tuple, Case] = {}
    for c in all_cases:
        if c.expect != "refused" and c.what != "over budget":
            if c.path not in last or rank(c) >= rank(last[c.path]):
                last[c.path] = c
    return [c for c in all_cases if last.get(c.path) is c or c.what == "over budget"]
