"""Scenario files: engine settings + requests, validated on load with a pydantic schema.

The schema is the dataclasses below (their ``Annotated`` types); pydantic checks a
file against them and reports every problem with its path in the file
("requests[2].max_tokens: ..."). Nothing is half-applied: load_scenario either
returns a complete Scenario or raises ScenarioError listing all problems.

Old files: ``engine.sliding_retention`` ("sparse" / "dense", before vLLM named the
setting) is still read, as ``prefix_cache_retention_interval`` 0 / null; the app's
lesson 5 switch still writes it, with those two words as its labels.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
)

from kvcore.config.kv_events import KVEventsConfig
from paged_kv_lab.text.i18n import Text, tr

MODELS = ("smollm2", "tiny-random", "tiny-hybrid")
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("float32", "bfloat16", "float16")
# "linear_attention": a Mamba-style state layer (Qwen3-Next / Qwen3.5's gated delta-net): its
# group holds state blocks (kvcore MambaSpec); only model-free runs have such layers so far.
LAYER_TYPES = ("full_attention", "sliding_attention", "linear_attention")
MAMBA_CACHE_MODES = ("align", "none")
HASH_ALGOS = ("xxhash", "sha256", "sha256_cbor", "xxhash_cbor")
POLICIES = ("fcfs", "priority")
FREE_ORDERS = ("v0.33", "legacy")
ADMISSIONS = ("full_sequence", "first_chunk")
# engine.sliding_retention -> prefix_cache_retention_interval
LEGACY_RETENTION = {"sparse": 0, "dense": None}
_FORBID = ConfigDict(extra="forbid")


class ScenarioError(ValueError):
    """A scenario that does not validate: ``problems`` one a line (``field: what is wrong``, in
    pydantic's words: data about the field); ``text`` the sentence around them (``str(e)`` in
    English)."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        self.text = Text("refusal.invalid_scenario", {"problems": lines})
        super().__init__(tr(self.text, "en"))


# Every integer fits the engine's 64-bit tensors (positions, seeds): a larger one is refused here,
# by name, rather than overflowing in a step.
INT64_MAX = 2**63 - 1
Int = Annotated[StrictInt, Field(ge=1, le=INT64_MAX)]
# a number in a range, kept as a float; the bounds are data, so the forms and tests read them
Fraction = Annotated[Union[StrictInt, StrictFloat], Field(ge=0, lt=1), AfterValidator(float)]
Utilization = Annotated[Union[StrictInt, StrictFloat], Field(gt=0, le=1), AfterValidator(float)]
Count = Annotated[StrictInt, Field(ge=0, le=INT64_MAX)]
OptInt = Optional[Int]


@dataclass(frozen=True)
class SpeculativeConfig:
    """vLLM's speculative_config, verified greedily. ``method``: "ngram" (prompt lookup) or
    "draft_model": the target's own first ``num_draft_layers`` layers with its final norm and LM
    head (kvcore/spec_decode/draft_model.py; null = three quarters of the model's layers, at
    least one), which writes K/V ahead, so the scheduler reserves ``num_speculative_tokens``
    lookahead slots. Unset lookup lengths follow vLLM: both unset -> 5 and 5, one set -> the
    other equals it."""

    __pydantic_config__ = _FORBID
    method: Literal["ngram", "draft_model"] = "ngram"
    num_speculative_tokens: Int = 3
    prompt_lookup_min: OptInt = None
    prompt_lookup_max: OptInt = None
    num_draft_layers: OptInt = None

    def __post_init__(self) -> None:
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if lo is None and hi is None:
            lo = hi = 5
        lo = hi if lo is None else lo
        hi = lo if hi is None else hi
        if lo > hi:
            raise ValueError(f"prompt_lookup_min={lo} must be <= prompt_lookup_max={hi}")
        object.__setattr__(self, "prompt_lookup_min", lo)
        object.__setattr__(self, "prompt_lookup_max", hi)


@dataclass(frozen=True)
class CPUOffloadConfig:
    """vLLM's SimpleCPUOffloadConnector (``kv_connector_extra_config``): a CPU pool of
    ``num_cpu_blocks`` blocks (its null block included) beside the GPU pool; ``lazy_offload``
    stores only the blocks about to be evicted from the GPU instead of every computed block
    (kvcore/simple_kv_offload/manager.py). ``kv_load_failure_policy`` is vLLM's
    ``KVTransferConfig`` setting: when a load fails, "fail" (vLLM's default) ends the request
    with an error, "recompute" computes the lost tokens again. ``fail_loads`` is ours, for
    teaching: the CPU -> GPU copy that first brings in each named request's blocks fails, and the
    worker reports those GPU blocks as ``invalid_block_ids`` (the other requests loading in that
    step share the copy, and its failure)."""

    __pydantic_config__ = _FORBID
    num_cpu_blocks: Annotated[StrictInt, Field(ge=2, le=INT64_MAX)] = 16
    lazy_offload: StrictBool = False
    kv_load_failure_policy: Literal["recompute", "fail"] = "fail"
    fail_loads: Annotated[tuple[StrictStr, ...], Field(max_length=1024)] = ()


@dataclass(frozen=True)
class EngineSettings:
    __pydantic_config__ = _FORBID
    block_size: Int = 16
    # counts the null block, as vLLM does; "auto": profile the model and derive it from
    # gpu_memory_utilization (kvcore/model/profile.py, kvcore/model/memory.py: KVCacheSizing)
    num_gpu_blocks: Union[Annotated[StrictInt, Field(ge=2, le=INT64_MAX)], Literal["auto"]] = 64
    gpu_memory_utilization: Utilization = 0.9
    enable_prefix_caching: StrictBool = True
    hash_algo: Literal[HASH_ALGOS] = "xxhash"
    # NONE_HASH seed: a string is the seed; null = vLLM's rule (PYTHONHASHSEED, else fixed
    # for sha256 and random for xxhash). See kvcore/core/kv_cache_utils.py.
    hash_seed: Optional[StrictStr] = "vllm-none-hash"
    max_num_seqs: Int = 8
    max_num_batched_tokens: Int = 256
    policy: Literal[POLICIES] = "fcfs"
    sliding_window: OptInt = None
    layer_types: Optional[Annotated[tuple[Literal[LAYER_TYPES], ...], Field(min_length=1)]] = None
    free_order: Literal[FREE_ORDERS] = "v0.33"
    admission: Literal[ADMISSIONS] = "full_sequence"
    # None: hash every full block of a sliding-window group; 0: only the blocks a later
    # request can hit (vLLM's default); n > 0: those and a checkpoint every n tokens.
    prefix_cache_retention_interval: Optional[Count] = 0
    # vLLM's CacheConfig names. mamba_cache_mode is resolved as vLLM resolves it for a model
    # with linear-attention layers: "align" with prefix caching, "none" without.
    # prefix_match_unit: hash every this many tokens (finer than block_size: hits inside a
    # block, with a linear-attention group in align mode); null = block_size.
    mamba_cache_mode: Literal[MAMBA_CACHE_MODES] = "none"
    prefix_match_unit: OptInt = None
    watermark: Fraction = 0.0
    max_cache_hit_length: Optional[Count] = None
    seed: Optional[Count] = None
    max_model_len: OptInt = None
    long_prefill_token_threshold: Count = 0
    # KV cache events published on ZeroMQ as vLLM does (vLLM's --kv-events-config); off when null.
    kv_events: Optional[KVEventsConfig] = None
    # Speculative decoding (kvcore/spec_decode/ngram_proposer.py); off when null.
    speculative: Optional[SpeculativeConfig] = None
    # A second tier: CPU offloading (kvcore/simple_kv_offload/); off when null.
    cpu_offload: Optional[CPUOffloadConfig] = None
    # Disaggregated serving: "pd" runs a prefill replica and a decode replica joined by the
    # NIXL connector's flow (paged_kv_lab/disagg/); null: one engine.
    kv_transfer: Optional[Literal["pd"]] = None


@dataclass(frozen=True)
class RequestSpec:
    __pydantic_config__ = _FORBID
    id: Annotated[StrictStr, Field(min_length=1)]
    prompt: Optional[Annotated[StrictStr, Field(min_length=1)]] = None
    prompt_token_ids: Optional[Annotated[tuple[Count, ...], Field(min_length=1)]] = None
    chat: StrictBool = False
    max_tokens: Int = 16
    arrival_step: Count = 0
    priority: Annotated[StrictInt, Field(ge=-INT64_MAX - 1, le=INT64_MAX)] = 0
    cache_salt: Optional[StrictStr] = None
    ignore_eos: StrictBool = False
    # parallel sampling (vLLM's SamplingParams.n): n child requests "0_<id>", "1_<id>", ...
    # (kvcore/engine/parallel_sampling.py)
    n: Int = 1
    # vLLM's SamplingParams.seed: sample at temperature 1 from this request's own generator
    # (child i of an n > 1 request: seed + i); None: greedy, or the engine's seed if it has one
    seed: Optional[Count] = None


@dataclass(frozen=True)
class Scenario:
    __pydantic_config__ = _FORBID
    name: StrictStr = "scenario"
    description: StrictStr = ""
    model: Literal[MODELS] = "smollm2"
    device: Literal[DEVICES] = "auto"
    dtype: Literal[DTYPES] = "float32"
    engine: EngineSettings = field(default_factory=EngineSettings)
    requests: tuple[RequestSpec, ...] = ()


_SCENARIO = TypeAdapter(Scenario)

# What a field must be, said once per field: the message for any error at that path.
_MUST: dict[str, str] = {
    "block_size": "an integer >= 1",
    "num_gpu_blocks": "an integer >= 2 (block 0 is the null block, "
    'so at least one usable block needs 2) or "auto"',
    "gpu_memory_utilization": "a number in (0, 1]",
    "max_num_seqs": "an integer >= 1",
    "max_num_batched_tokens": "an integer >= 1",
    "long_prefill_token_threshold": "an integer >= 0",
    "enable_prefix_caching": "true or false",
    "hash_algo": "one of " + ", ".join(HASH_ALGOS),
    "hash_seed": "a string or null",
    "policy": "one of " + ", ".join(POLICIES),
    "free_order": "one of " + ", ".join(FREE_ORDERS),
    "admission": "one of " + ", ".join(ADMISSIONS),
    "sliding_window": "null or a positive integer",
    "max_model_len": "null or a positive integer",
    "seed": "null or an integer >= 0",
    "prefix_cache_retention_interval": "null or an integer >= 0",
    "max_cache_hit_length": "null or an integer >= 0",
    "watermark": "a number in [0, 1)",
    "layer_types": "a non-empty list of " + " / ".join(LAYER_TYPES),
    "mamba_cache_mode": "one of " + ", ".join(MAMBA_CACHE_MODES),
    "prefix_match_unit": "null or a positive integer",
    "id": "a non-empty string",
    "prompt": "a non-empty string",
    "prompt_token_ids": "a non-empty list of token ids (integers >= 0)",
    "chat": "true or false",
    "max_tokens": "an integer >= 1",
    "num_draft_layers": "null or an integer >= 1 (at most the model's layers)",
    "method": 'one of "ngram", "draft_model"',
    "num_speculative_tokens": "an integer >= 1",
    "prompt_lookup_min": "null or an integer >= 1",
    "prompt_lookup_max": "null or an integer >= 1",
    "arrival_step": "an integer >= 0",
    "priority": "an integer",
    "cache_salt": "a string or null",
    "ignore_eos": "true or false",
    "n": "an integer >= 1",
    "model": "one of " + ", ".join(MODELS),
    "device": "one of " + ", ".join(DEVICES),
    "dtype": "one of " + ", ".join(DTYPES),
    "name": "a string",
    "description": "a string",
    "engine": "an object",
    "requests": "a list",
    "enable_kv_cache_events": "true or false",
    "publisher": '"zmq" or "null"',
    "endpoint": "a tcp://, ipc:// or inproc:// endpoint",
    "replay_endpoint": "null or a tcp://, ipc:// or inproc:// endpoint",
    "buffer_steps": "an integer >= 1",
    "hwm": "an integer >= 1",
    "max_queue_size": "an integer >= 1",
    "topic": "a string",
    "use_int_block_hashes": "true or false",
    "num_cpu_blocks": "an integer >= 2 (the CPU pool's null block included)",
    "lazy_offload": "true or false",
    "kv_load_failure_policy": '"recompute" or "fail"',
    "fail_loads": "a list of request ids",
    "kv_transfer": 'null or "pd"',
}
_SECTIONS = {
    (): Scenario,
    ("engine",): EngineSettings,
    ("requests", int): RequestSpec,
    ("engine", "kv_events"): KVEventsConfig,
    ("engine", "speculative"): SpeculativeConfig,
    ("engine", "cpu_offload"): CPUOffloadConfig,
}


def _path(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _section(loc: tuple):
    shape = tuple(int if isinstance(p, int) else p for p in loc)
    return _SECTIONS.get(shape)


def _problem(err: dict, raw: Any) -> str:
    loc = tuple(
        p for p in err["loc"] if not (isinstance(p, str) and p.startswith(("function-", "tagged-")))
    )
    if err["type"] == "unexpected_keyword_argument" or err["type"] == "extra_forbidden":
        cls = _section(loc[:-1])
        known = ", ".join(sorted(f.name for f in fields(cls))) if cls else ""
        what = "setting" if cls is EngineSettings else "field"
        return f"{_path(loc)}: unknown {what} (known: {known})"
    # KVEventsConfig's own check
    if err["type"] == "value_error" and loc[:2] == ("engine", "kv_events"):
        return f"engine.{err['ctx']['error']}"
    if err["type"] in ("dataclass_type", "dataclass_args_type", "model_type", "dict_type"):
        return f"{_path(loc)}: must be an object"
    if err["type"] == "missing" or err["type"] == "missing_argument":
        return f"{_path(loc)}: must be {_MUST.get(loc[-1], 'given')}; got None"
    got, ctx = _value_at(raw, loc), err.get("ctx", {})
    if isinstance(got, int) and INT64_MAX in (ctx.get("le"), -1 - ctx.get("ge", 0)):
        side = "at most" if "le" in ctx else "at least"
        bound = ctx.get("le", ctx.get("ge"))
        return f"{_path(loc)}: must be {side} {bound:,} (a 64-bit integer); got {got!r}"
    # Cut the path at the field (an element of a list reports the whole list).
    for i in range(len(loc) - 1, -1, -1):
        if isinstance(loc[i], str) and _section(loc[:i]) is not None:
            value = _value_at(raw, loc[: i + 1])
            if loc[i] not in _MUST:  # a field without its sentence: pydantic's words, its path
                return f"{_path(loc[: i + 1])}: {err['msg']}; got {value!r}"
            return f"{_path(loc[: i + 1])}: must be {_MUST[loc[i]]}; got {value!r}"
    return f"{_path(loc)}: {err['msg']}"


def _value_at(raw: Any, loc: tuple) -> Any:
    for part in loc:
        try:
            raw = raw[part]
        except (KeyError, IndexError, TypeError):
            return None
    return raw


def _cross_checks(raw: dict) -> list[str]:
    """Rules between fields, checked on the raw file so they are reported with the rest."""
    problems = []
    eng = raw.get("engine")
    if isinstance(eng, dict):
        lt = eng.get("layer_types")
        if isinstance(lt, list) and "sliding_attention" in lt and eng.get("sliding_window") is None:
            problems.append(
                "engine.layer_types: sliding_attention layers need engine.sliding_window"
            )
        linear = isinstance(lt, list) and "linear_attention" in lt
        unit, bs0 = eng.get("prefix_match_unit"), eng.get("block_size", 16)
        if isinstance(unit, int) and isinstance(bs0, int) and unit > 0 and bs0 > 0:
            if bs0 % unit:
                problems.append(
                    f"engine.prefix_match_unit: must divide block_size ({bs0}); got {unit}"
                )
            elif unit != bs0 and not linear:
                problems.append(
                    "engine.prefix_match_unit: with one kind of layer, hits land on the block "
                    f"size ({bs0}); unset it, or add linear_attention layers (layer_types)"
                )
        if linear and eng.get("enable_prefix_caching") is False:
            problems.append(
                "engine.layer_types: linear_attention layers without prefix caching "
                '(mamba_cache_mode "none", one state block a request) are not modelled yet'
            )
        r, bs = eng.get("prefix_cache_retention_interval"), eng.get("block_size", 16)
        if (
            isinstance(r, int)
            and not isinstance(r, bool)
            and isinstance(bs, int)
            and bs > 0
            and r > 0
        ):
            if r % bs:
                problems.append(
                    f"engine.prefix_cache_retention_interval: must be a multiple of "
                    f"block_size ({bs}); got {r}"
                )
            elif eng.get("sliding_window") is None and not linear:
                problems.append(
                    "engine.prefix_cache_retention_interval: > 0 needs a sliding window "
                    "(full attention hashes every full block); use 0 or null"
                )
    reqs = raw.get("requests")
    fail_loads = eng.get("cpu_offload") if isinstance(eng, dict) else None
    fail_loads = fail_loads.get("fail_loads") if isinstance(fail_loads, dict) else None
    if isinstance(fail_loads, list) and isinstance(reqs, list):
        ids = set()
        for r in reqs:
            if isinstance(r, dict):
                n = r.get("n")
                many = isinstance(n, int) and not isinstance(n, bool) and 1 < n <= 1024
                # an n > 1 request runs as its children "0_<id>", "1_<id>"...
                ids.update([f"{k}_{r.get('id')}" for k in range(n)] if many else [r.get("id")])
        for j, rid in enumerate(fail_loads):
            if isinstance(rid, str) and rid not in ids:
                problems.append(
                    f"engine.cpu_offload.fail_loads[{j}]: no request runs with the id {rid!r}"
                )
    if isinstance(reqs, list):
        seen = set()
        for i, r in enumerate(reqs):
            if not isinstance(r, dict):
                continue
            if (r.get("prompt") is None) == (r.get("prompt_token_ids") is None):
                problems.append(f"requests[{i}]: give exactly one of prompt or prompt_token_ids")
            rid = r.get("id")
            if isinstance(rid, str) and rid:
                if rid in seen:
                    problems.append(f"requests[{i}].id: duplicate id {rid!r}")
                seen.add(rid)
        # an n > 1 request runs as children "0_<id>", "1_<id>"...: no id may be used twice
        n_of = {
            r["id"]: r.get("n")
            for r in reqs
            if isinstance(r, dict) and isinstance(r.get("id"), str)
        }
        for pid, n in n_of.items():
            if isinstance(n, int) and not isinstance(n, bool) and 1 < n <= 1024:
                clash = sorted(f"{k}_{pid}" for k in range(n) if f"{k}_{pid}" in n_of)
                if clash:
                    problems.append(
                        f"requests: {pid!r} has n = {n}, so it runs as {clash[0]!r}...; "
                        f"that id is already another request's"
                    )
    return problems


def _problem_order(problem: str) -> tuple:
    """File order: top-level fields, then engine, then requests by index."""
    m = re.match(r"requests\[(\d+)\]", problem)
    if m:
        return (2, int(m.group(1)))
    return (1,) if problem.startswith("engine") else (0,)


def _upgrade(raw: dict) -> dict:
    """Read old setting names as the vLLM ones that replaced them."""
    eng = raw.get("engine")
    if not isinstance(eng, dict) or "sliding_retention" not in eng:
        return raw
    eng = dict(eng)
    old = eng.pop("sliding_retention")
    if old not in LEGACY_RETENTION:
        raise ScenarioError(
            [
                f"engine.sliding_retention: must be one of sparse, dense (old name of "
                f"prefix_cache_retention_interval); got {old!r}"
            ]
        )
    if "prefix_cache_retention_interval" in eng:
        raise ScenarioError(
            [
                "engine.sliding_retention: give prefix_cache_retention_interval only "
                "(sliding_retention is its old name: sparse = 0, dense = null)"
            ]
        )
    eng["prefix_cache_retention_interval"] = LEGACY_RETENTION[old]
    return {**raw, "engine": eng}


def load_scenario(source: Union[dict, str, Path]) -> Scenario:
    """Parse and validate a scenario from a dict, a JSON string, or a path to a JSON file."""
    if isinstance(source, Path) or (
        isinstance(source, str) and not source.lstrip().startswith(("{", "["))
    ):
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
    source = _upgrade(source)
    problems: list[str] = []
    scenario = None
    try:
        scenario = _SCENARIO.validate_python(source)
    except ValidationError as e:
        for err in e.errors():
            p = _problem(err, source)
            if p not in problems:
                problems.append(p)
    problems += [p for p in _cross_checks(source) if p not in problems]
    problems.sort(key=_problem_order)
    if problems:
        raise ScenarioError(problems)
    return scenario


def _plain(v: Any) -> Any:
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


# Engine settings added after the lessons' runs were recorded: left out of the file format at
# their defaults, so a recorded run (whose header holds the scenario) stays byte for byte.
_LATER_ENGINE_DEFAULTS = {
    "mamba_cache_mode": "none",
    "prefix_match_unit": None,
    "kv_transfer": None,
}


def scenario_to_dict(s: Scenario) -> dict:
    """The scenario in its file format (defaults of requests left out for readability)."""
    d = _plain(asdict(s))
    for key, default in _LATER_ENGINE_DEFAULTS.items():
        if d["engine"].get(key, default) == default:
            d["engine"].pop(key, None)
    default_req = asdict(RequestSpec(id=""))
    d["requests"] = [
        {k: v for k, v in r.items() if k == "id" or v != _plain(default_req[k])}
        for r in d["requests"]
    ]
    return d


def parse_engine_overrides(pairs: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` strings (the CLI's ``--set``) as engine settings; a value is read as JSON
    (``null``, ``0.1``, ``"x"``) and otherwise taken as text. ScenarioError names a bad pair."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ScenarioError([f"--set {pair!r}: write KEY=VALUE, e.g. watermark=0.1"])
        key = key.strip()
        if isinstance(getattr(EngineSettings, key, None), str) and value != "null":
            out[key] = value  # a text setting stays text: hash_seed=0 is the seed "0"
            continue
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def with_engine_overrides(s: Scenario, overrides: dict[str, Any]) -> Scenario:
    """The scenario with some engine settings replaced, validated like a file (problems with
    paths)."""
    d = scenario_to_dict(s)
    d["engine"] = {**d["engine"], **overrides}
    return load_scenario(d)
