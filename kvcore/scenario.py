"""Scenario files: engine settings + requests, validated on load.

Every problem is reported with its path in the file ("requests[2].max_tokens: ...")
and nothing is half-applied: load_scenario either returns a complete Scenario or
raises ScenarioError listing all problems.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Optional, Union

MODELS = ("smollm2", "tiny-random")
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("float32", "bfloat16", "float16")
LAYER_TYPES = ("full_attention", "sliding_attention")


class ScenarioError(ValueError):
    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("invalid scenario:\n" + "\n".join(f"  - {p}" for p in self.problems))


@dataclass(frozen=True)
class EngineSettings:
    block_size: int = 16
    num_gpu_blocks: int = 64            # counts the null block, as vLLM does
    enable_prefix_caching: bool = True
    hash_algo: str = "xxhash"
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 256
    policy: str = "fcfs"
    sliding_window: Optional[int] = None
    layer_types: Optional[tuple[str, ...]] = None
    free_order: str = "v0.33"
    admission: str = "full_sequence"
    sliding_retention: str = "sparse"
    seed: Optional[int] = None
    max_model_len: Optional[int] = None
    long_prefill_token_threshold: int = 0


@dataclass(frozen=True)
class RequestSpec:
    id: str
    prompt: Optional[str] = None
    prompt_token_ids: Optional[tuple[int, ...]] = None
    chat: bool = False
    max_tokens: int = 16
    arrival_step: int = 0
    priority: int = 0
    cache_salt: Optional[str] = None
    ignore_eos: bool = False


@dataclass(frozen=True)
class Scenario:
    name: str = "scenario"
    description: str = ""
    model: str = "smollm2"
    device: str = "auto"
    dtype: str = "float32"
    engine: EngineSettings = field(default_factory=EngineSettings)
    requests: tuple[RequestSpec, ...] = ()


_CHOICES = {
    "hash_algo": ("xxhash", "sha256"),
    "policy": ("fcfs", "priority"),
    "free_order": ("v0.33", "legacy"),
    "admission": ("full_sequence", "first_chunk"),
    "sliding_retention": ("sparse", "dense"),
}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_engine(raw: Any, problems: list[str]) -> Optional[EngineSettings]:
    if raw is None:
        return EngineSettings()
    if not isinstance(raw, dict):
        problems.append("engine: must be an object")
        return None
    known = {f.name for f in fields(EngineSettings)}
    for k in raw:
        if k not in known:
            problems.append(f"engine.{k}: unknown setting (known: {', '.join(sorted(known))})")
    v = {**asdict(EngineSettings()), **{k: raw[k] for k in raw if k in known}}
    for name, lo in (("block_size", 1), ("num_gpu_blocks", 2), ("max_num_seqs", 1),
                     ("max_num_batched_tokens", 1), ("long_prefill_token_threshold", 0)):
        if not _is_int(v[name]) or v[name] < lo:
            extra = " (block 0 is the null block, so at least one usable block needs 2)" if name == "num_gpu_blocks" else ""
            problems.append(f"engine.{name}: must be an integer >= {lo}{extra}; got {v[name]!r}")
    for name in ("enable_prefix_caching",):
        if not isinstance(v[name], bool):
            problems.append(f"engine.{name}: must be true or false; got {v[name]!r}")
    for name, choices in _CHOICES.items():
        if v[name] not in choices:
            problems.append(f"engine.{name}: must be one of {', '.join(choices)}; got {v[name]!r}")
    for name in ("sliding_window", "seed", "max_model_len"):
        if v[name] is not None and (not _is_int(v[name]) or v[name] < (0 if name == "seed" else 1)):
            problems.append(f"engine.{name}: must be null or a positive integer; got {v[name]!r}")
    lt = v["layer_types"]
    if lt is not None:
        if not isinstance(lt, (list, tuple)) or not lt or any(t not in LAYER_TYPES for t in lt):
            problems.append(f"engine.layer_types: must be a non-empty list of {' / '.join(LAYER_TYPES)}; got {lt!r}")
        else:
            v["layer_types"] = tuple(lt)
            if "sliding_attention" in lt and v["sliding_window"] is None:
                problems.append("engine.layer_types: sliding_attention layers need engine.sliding_window")
    return EngineSettings(**v) if not problems else None


def _check_request(i: int, raw: Any, problems: list[str]) -> Optional[RequestSpec]:
    p = f"requests[{i}]"
    if not isinstance(raw, dict):
        problems.append(f"{p}: must be an object")
        return None
    known = {f.name for f in fields(RequestSpec)}
    n0 = len(problems)
    for k in raw:
        if k not in known:
            problems.append(f"{p}.{k}: unknown field (known: {', '.join(sorted(known))})")
    rid = raw.get("id")
    if not isinstance(rid, str) or not rid:
        problems.append(f"{p}.id: must be a non-empty string; got {rid!r}")
    prompt, ids = raw.get("prompt"), raw.get("prompt_token_ids")
    if (prompt is None) == (ids is None):
        problems.append(f"{p}: give exactly one of prompt or prompt_token_ids")
    if prompt is not None and (not isinstance(prompt, str) or not prompt):
        problems.append(f"{p}.prompt: must be a non-empty string")
    if ids is not None and (not isinstance(ids, list) or not ids or not all(_is_int(t) and t >= 0 for t in ids)):
        problems.append(f"{p}.prompt_token_ids: must be a non-empty list of token ids (integers >= 0)")
    for name, lo in (("max_tokens", 1), ("arrival_step", 0)):
        if name in raw and (not _is_int(raw[name]) or raw[name] < lo):
            problems.append(f"{p}.{name}: must be an integer >= {lo}; got {raw[name]!r}")
    if "priority" in raw and not _is_int(raw["priority"]):
        problems.append(f"{p}.priority: must be an integer; got {raw['priority']!r}")
    for name in ("chat", "ignore_eos"):
        if name in raw and not isinstance(raw[name], bool):
            problems.append(f"{p}.{name}: must be true or false; got {raw[name]!r}")
    if raw.get("cache_salt") is not None and not isinstance(raw["cache_salt"], str):
        problems.append(f"{p}.cache_salt: must be a string or null")
    if len(problems) > n0:
        return None
    args = {k: raw[k] for k in raw if k in known}
    if ids is not None:
        args["prompt_token_ids"] = tuple(ids)
    return RequestSpec(**args)


def load_scenario(source: Union[dict, str, Path]) -> Scenario:
    """Parse and validate a scenario from a dict, a JSON string, or a path to a JSON file."""
    if isinstance(source, Path) or (isinstance(source, str) and not source.lstrip().startswith(("{", "["))):
        try:
            text = Path(source).read_text(encoding="utf-8")
        except OSError as e:
            raise ScenarioError([f"file: cannot read {source}: {e.strerror or e}"]) from None
        source = text
    if isinstance(source, (str, bytes)):
        try:
            source = json.loads(source)
        except json.JSONDecodeError as e:
            raise ScenarioError([f"json: line {e.lineno} column {e.colno}: {e.msg}"]) from None
    if not isinstance(source, dict):
        raise ScenarioError(["(top level): must be a JSON object"])
    problems: list[str] = []
    known = {f.name for f in fields(Scenario)}
    for k in source:
        if k not in known:
            problems.append(f"{k}: unknown field (known: {', '.join(sorted(known))})")
    for name, choices in (("model", MODELS), ("device", DEVICES), ("dtype", DTYPES)):
        if name in source and source[name] not in choices:
            problems.append(f"{name}: must be one of {', '.join(choices)}; got {source[name]!r}")
    for name in ("name", "description"):
        if name in source and not isinstance(source[name], str):
            problems.append(f"{name}: must be a string")
    engine_problems: list[str] = []
    engine = _check_engine(source.get("engine"), engine_problems)
    problems += engine_problems
    reqs_raw = source.get("requests", [])
    reqs: list[RequestSpec] = []
    if not isinstance(reqs_raw, list):
        problems.append("requests: must be a list")
    else:
        seen = set()
        for i, r in enumerate(reqs_raw):
            spec = _check_request(i, r, problems)
            if spec is not None:
                if spec.id in seen:
                    problems.append(f"requests[{i}].id: duplicate id {spec.id!r}")
                seen.add(spec.id)
                reqs.append(spec)
    if problems:
        raise ScenarioError(problems)
    return Scenario(
        name=source.get("name", "scenario"), description=source.get("description", ""),
        model=source.get("model", "smollm2"), device=source.get("device", "auto"),
        dtype=source.get("dtype", "float32"), engine=engine, requests=tuple(reqs))


def _plain(v: Any) -> Any:
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


def scenario_to_dict(s: Scenario) -> dict:
    """The scenario in its file format (defaults of requests left out for readability)."""
    d = _plain(asdict(s))
    default_req = asdict(RequestSpec(id=""))
    d["requests"] = [{k: v for k, v in r.items() if k == "id" or v != _plain(default_req[k])}
                     for r in d["requests"]]
    return d
