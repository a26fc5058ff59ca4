"""Routers in front of a fleet of replicas: which replica serves the next request.

Each policy follows its project's own code or documentation (named in its docstring and in the
catalogue, ``fleet.router.<name>.source``). A router sees a request (its prompt's block hashes as
the KV events publish them) and, per replica, a :class:`ReplicaView` taken at the moment of the
decision: the overlap of the prompt with that replica's blocks as the router's global index knows
them (built only from the replicas' KV events, see fleet/index.py), and its load. It answers with
a :class:`Decision` that carries the numbers it compared, so "why replica 2?" is answered by the
decision itself (``Router.why``: the catalogue sentence ``fleet.why.<name>`` filled with them).

The policies are a registry: a router is one class, registered with ``@router("name")``. The
command line's ``--router`` choices, the settings ``--set`` takes and their checks, the app's
lists of policies and the tests all read the registry (``policies()``, ``router_defaults()``,
``router_settings()``, ``make_router()``); the catalogue names it (``fleet.router.<name>``, its
``.source``, its why-sentence ``fleet.why.<name>``).
"""

from __future__ import annotations

import hashlib
import random
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Optional, Sequence

from kvcore.core.kv_cache_utils import RequestBlockHasher, get_request_block_hasher
from paged_kv_lab.text.i18n import Text

# Settings every router takes (``--set`` keys besides the engine's); a policy's own settings are
# its class's ``defaults``. Dynamo's defaults are KvRouterConfig's in ai-dynamo-runtime 1.6.1
# (dynamo/_core.pyi); sglang-router's are RouterArgs' in sglang-router 0.3.2
# (sglang_router/router_args.py).
#
# The router hashes a prompt itself and looks the hashes up in its index, which holds the hashes
# the engines published: ``kv_cache_block_size`` (Dynamo's name for the block size its router is
# given) and ``none_hash_seed`` (the seed of the chain's root, NONE_HASH, which vLLM reads from
# PYTHONHASHSEED or its hash_seed) must be the engine's, or no prompt overlaps any replica. 0 and
# "" stand for "the engine's" (what a correctly configured router has).
COMMON_DEFAULTS: dict[str, Any] = {
    "seed": 0,
    "kv_event_lag_ms": 0.0,
    "kv_cache_block_size": 0,
    "none_hash_seed": "",
}
LOAD_METRICS = ("requests", "kv_usage")


class RouterError(ValueError):
    """A router setting that cannot be used (named, with what is allowed)."""


@dataclass(frozen=True)
class FleetRequest:
    """What a router may read of a request: its id, prompt length, session key (a conversation's
    id; see fleet/trace_fleet.py for the trace formats) and its full prompt blocks' hashes as the KV
    events name them (16 hex digits each), in prompt order."""

    request_id: str
    num_prompt_tokens: int
    session: str
    block_hashes: tuple[str, ...]
    block_size: int


@dataclass(frozen=True)
class ReplicaView:
    """One replica at the moment of a decision. ``overlap_blocks``: the leading prompt blocks the
    router's index says it holds; ``running`` / ``waiting``: its scheduler's queues (requests
    routed there but not yet added count as waiting); ``used_blocks`` / ``usable_blocks``: its
    pool; ``prefill_tokens``: prompt tokens routed there whose first token is still to come,
    less the overlap the router credited when it routed them (Dynamo's prompt-side load);
    ``cached_blocks``: the blocks the router's index holds for it; ``active_blocks``: the distinct
    blocks of the requests routed there and not finished, and ``incoming_active_blocks`` those of
    this request's blocks not among them (Dynamo's active-block tracking with KV reuse
    assumed)."""

    index: int
    overlap_blocks: int
    running: int
    waiting: int
    used_blocks: int
    usable_blocks: int
    prefill_tokens: int
    cached_blocks: int = 0
    active_blocks: int = 0
    incoming_active_blocks: int = 0

    @property
    def requests(self) -> int:
        return self.running + self.waiting

    @property
    def usage(self) -> float:
        return self.used_blocks / self.usable_blocks if self.usable_blocks else 0.0


@dataclass(frozen=True)
class Decision:
    """A routing decision and the numbers behind it, one entry per replica. ``score`` is what the
    policy compared (its meaning in ``score_name``: "cost" is lowest-wins, anything else
    highest-wins or informative); ``rule`` names the branch taken (one of its policy's
    ``rules``; for a policy with several, the catalogue's ``fleet.rule.<rule>`` says it)."""

    replica: int
    policy: str
    rule: str
    overlap_blocks: tuple[int, ...]
    load: tuple[int, ...]
    score_name: Optional[str] = None
    score: Optional[tuple[float, ...]] = None
    detail: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = {
            "replica": self.replica,
            "policy": self.policy,
            "rule": self.rule,
            "overlap_blocks": list(self.overlap_blocks),
            "load": list(self.load),
        }
        if self.score is not None:
            d[self.score_name or "score"] = [round(s, 6) for s in self.score]
        d.update(self.detail)
        return d


def _base(policy: str, replica: int, rule: str, views: Sequence[ReplicaView], **kw) -> Decision:
    return Decision(
        replica,
        policy,
        rule,
        tuple(v.overlap_blocks for v in views),
        tuple(v.requests for v in views),
        **kw,
    )


class Router:
    """Base: ``choose`` picks a replica for a request and says why. Invariant: a router's choices
    depend only on the requests and views it was shown and its seed (same inputs, same
    choices).

    A policy is a subclass registered with ``@router("name")`` (which sets ``name``). It declares
    its own settings and their defaults (``defaults``), refuses bad values of them (``check``),
    lists the rules its decisions can name (``rules``), and fills its why-sentence
    ``fleet.why.<name>`` with the numbers of a decision (``why_fields``)."""

    name: ClassVar[str] = ""
    defaults: ClassVar[dict[str, Any]] = {}
    rules: ClassVar[tuple[str, ...]] = ()

    def __init__(self, settings: dict) -> None:
        self.settings = settings

    @classmethod
    def check(cls, settings: dict) -> None:
        """RouterError for a value of one of this policy's own settings that cannot be used."""

    def choose(self, request: FleetRequest, views: Sequence[ReplicaView]) -> Decision:
        raise NotImplementedError

    @classmethod
    def why(cls, decision: Decision, settings: dict) -> Text:
        """ "Why this replica?": the sentence ``fleet.why.<name>`` with the decision's numbers
        (and, for the settings it compared with, ``settings``)."""
        return Text(f"fleet.why.{cls.name}", cls.why_fields(decision, settings))

    @classmethod
    def why_fields(cls, decision: Decision, settings: dict) -> dict[str, Any]:
        """The fields every why-sentence may name: the replica chosen (``replica``) among ``n``,
        the prompt's leading blocks the index showed there (``overlap``), at the others
        (``others``) and at each (``overlaps``), and the requests running or waiting there
        (``load``) and at each (``loads``). A policy adds its own."""
        d, j = decision, decision.replica
        return {
            "replica": j,
            "n": len(d.overlap_blocks),
            "overlap": d.overlap_blocks[j],
            "others": ", ".join(str(x) for i, x in enumerate(d.overlap_blocks) if i != j) or "-",
            "overlaps": _listed(d.overlap_blocks),
            "load": d.load[j],
            "loads": _listed(d.load),
        }


def _listed(values, fmt: str = "{}") -> str:
    """Numbers per replica, replica 0 first."""
    return ", ".join(fmt.format(v) for v in values)


def _percent(x: float) -> str:
    return f"{x:.1%}"


def _rule(decision: Decision, fields: dict) -> Text:
    """The branch a decision took, as its sentence ``fleet.rule.<rule>``."""
    return Text(f"fleet.rule.{decision.rule}", fields)


ROUTERS: dict[str, type[Router]] = {}


def router(name: str) -> Callable[[type[Router]], type[Router]]:
    """Register the Router subclass below as policy ``name``: one line, and it is a ``--router``
    choice, in the app's lists and in the tests' loops. ValueError for a name taken, or for a
    setting another policy already declares with another default."""

    def register(cls: type[Router]) -> type[Router]:
        if name in ROUTERS:
            raise ValueError(f"a router named {name!r} is registered already")
        known = router_defaults()
        for key, value in cls.defaults.items():
            if key in known and known[key] != value:
                raise ValueError(f"router setting {key!r}: {name!r} gives another default")
        cls.name = name
        ROUTERS[name] = cls
        return cls

    return register


def policies() -> tuple[str, ...]:
    """The registered policies, in registration order."""
    return tuple(ROUTERS)


def router_class(policy: str) -> type[Router]:
    if policy not in ROUTERS:
        raise RouterError(f"router: one of {', '.join(policies())}; got {policy!r}")
    return ROUTERS[policy]


def router_defaults() -> dict[str, Any]:
    """Every router setting with its default: the common ones, then each policy's own."""
    out = dict(COMMON_DEFAULTS)
    for cls in ROUTERS.values():
        for key, value in cls.defaults.items():
            out.setdefault(key, value)
    return out


def _at_least(settings: dict, keys: Sequence[str], low: float = 0) -> None:
    for k in keys:
        if settings[k] < low:
            raise RouterError(f"{k}: must be >= {low}; got {settings[k]!r}")


@router("round_robin")
class RoundRobin(Router):
    """Replica 0, 1, ..., N-1, 0, ... in arrival order (Dynamo's ``--router-mode round-robin``,
    sglang-router's ``round_robin``)."""

    rules = ("round_robin",)

    def __init__(self, settings: dict) -> None:
        super().__init__(settings)
        self._next = 0

    def choose(self, request, views):
        i = self._next % len(views)
        self._next += 1
        return _base(self.name, i, "round_robin", views)


@router("random")
class RandomRouter(Router):
    """A uniformly random replica, seeded (``seed``), as sglang-router's ``random``."""

    rules = ("random",)

    def __init__(self, settings: dict) -> None:
        super().__init__(settings)
        self._rng = random.Random(settings["seed"])

    def choose(self, request, views):
        return _base(self.name, self._rng.randrange(len(views)), "random", views)

    @classmethod
    def why_fields(cls, decision, settings):
        return {**super().why_fields(decision, settings), "seed": settings["seed"]}


@router("least_loaded")
class LeastLoaded(Router):
    """The replica with the fewest requests (running + waiting), or with ``load_metric=kv_usage``
    the lowest KV-cache usage; ties go to the lower index (Dynamo's ``least-loaded`` mode,
    vLLM production-stack's ``roundrobin``/``least-loaded`` routing by engine stats)."""

    defaults = {"load_metric": "requests"}
    rules = ("least_requests", "least_kv_usage")

    @classmethod
    def check(cls, settings):
        if settings["load_metric"] not in LOAD_METRICS:
            raise RouterError(
                f"load_metric: one of {', '.join(LOAD_METRICS)}; got {settings['load_metric']!r}"
            )

    def choose(self, request, views):
        kv = self.settings["load_metric"] == "kv_usage"
        key = (
            (lambda v: (v.usage, v.requests, v.index))
            if kv
            else (lambda v: (v.requests, v.usage, v.index))
        )
        best = min(views, key=key)
        score = tuple(v.usage if kv else float(v.requests) for v in views)
        return _base(
            self.name,
            best.index,
            "least_" + ("kv_usage" if kv else "requests"),
            views,
            score_name="kv_usage" if kv else "requests",
            score=score,
        )

    @classmethod
    def why_fields(cls, decision, settings):
        d, j = decision, decision.replica
        fmt = _percent if d.rule == "least_kv_usage" else (lambda x: f"{x:g}")
        scores = ", ".join(fmt(x) for x in d.score)
        rule = _rule(d, {"replica": j, "scores": scores, "score": fmt(d.score[j])})
        return {**super().why_fields(d, settings), "rule": rule}


@router("session")
class Session(Router):
    """Session affinity by consistent hashing: each replica owns ``virtual_nodes`` points on a
    ring of 2^64 (sha256 of "replica-i-v"); a session goes to the owner of the first point at or
    after its own hash, so a conversation stays on one replica and adding a replica moves only
    about 1/N of the sessions. As vLLM production-stack's session router
    (src/vllm_router/routers/routing_logic.py, ``SessionRouter`` on a hash ring) and
    vllm-router's ``consistent_hash`` policy (docs/load_balancing/README.md)."""

    defaults = {"virtual_nodes": 160}
    rules = ("session",)

    @classmethod
    def check(cls, settings):
        _at_least(settings, ("virtual_nodes",), 1)

    def __init__(self, settings: dict) -> None:
        super().__init__(settings)
        self._ring: list[tuple[int, int]] = []
        self._n = 0

    @staticmethod
    def _point(text: str) -> int:
        return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")

    def owner(self, session: str, n: int) -> int:
        if n != self._n:
            v = self.settings["virtual_nodes"]
            self._ring = sorted(
                (self._point(f"replica-{i}-{k}"), i) for i in range(n) for k in range(v)
            )
            self._n = n
        h = self._point(session)
        keys = self._ring
        i = bisect_right(keys, (h, n))
        return keys[i % len(keys)][1]

    def choose(self, request, views):
        i = self.owner(request.session, len(views))
        return _base(self.name, i, "session", views, detail={"session": request.session})

    @classmethod
    def why_fields(cls, decision, settings):
        return {**super().why_fields(decision, settings), "session": decision.detail["session"]}


@router("prefix")
class PrefixAware(Router):
    """The precise KV-aware choice: the replica whose blocks (in the router's global index, fed
    only by the replicas' KV events) cover the longest leading part of the prompt; ties go to
    the least loaded (running + waiting), then to the one whose index holds fewest blocks (a cold
    prompt goes where it displaces least), then to the lower index. As llm-d's precise
    prefix-cache scorer and Dynamo's KV indexer: a longest-prefix match over event-fed block
    hashes (llm-d-kv-cache-manager docs/architecture.md; Dynamo docs, "Router Design")."""

    rules = ("prefix_longest", "prefix_none_least_loaded")

    def choose(self, request, views):
        best = min(views, key=lambda v: (-v.overlap_blocks, v.requests, v.cached_blocks, v.index))
        rule = "prefix_longest" if best.overlap_blocks else "prefix_none_least_loaded"
        return _base(self.name, best.index, rule, views)

    @classmethod
    def why_fields(cls, decision, settings):
        fields = super().why_fields(decision, settings)
        return {**fields, "rule": _rule(decision, fields)}


@router("dynamo")
class DynamoKv(Router):
    """Dynamo's KV router cost (ai-dynamo-runtime 1.6.1, ``KvRouterConfig`` in dynamo/_core.pyi;
    the formula from Dynamo's "Routing Concepts" page, Cost Calculation): per worker

        raw_prefill_blocks      = active_prefill_blocks + incoming_prompt_blocks
        adjusted_prefill_blocks = max(raw_prefill_blocks - overlap_score_credit * overlap, 0)
        decode_blocks           = active_decode_blocks + incoming_active_blocks
                                  (+ decode_active_request_weight * active requests)
        cost = prefill_load_scale * adjusted_prefill_blocks + decode_blocks

    lowest cost wins (router_temperature 0; equal costs: a seeded random pick among them, as the
    router picks among equal workers). The cost itself lives in Dynamo's compiled Rust; this
    follows its documentation and the Python stub's defaults. The loads are the router's own
    bookkeeping, as Dynamo's: active prefill = prompt tokens routed and not yet answered with a
    first token, less the overlap credited at routing; active decode blocks = distinct blocks of
    the requests in flight (``router_assume_kv_reuse``: shared full blocks count once, a partial
    last block is the request's own; output blocks are not tracked, the default)."""

    defaults = {
        "overlap_score_credit": 1.0,
        "prefill_load_scale": 1.0,
        "decode_active_request_weight": 0.0,
        "router_temperature": 0.0,
    }
    rules = ("dynamo_lowest_cost",)

    @classmethod
    def check(cls, settings):
        keys = ("overlap_score_credit", "prefill_load_scale", "decode_active_request_weight")
        _at_least(settings, keys)

    def __init__(self, settings: dict) -> None:
        super().__init__(settings)
        self._rng = random.Random(settings["seed"])
        if settings["router_temperature"] != 0:
            raise RouterError("router_temperature: only 0 (the default, deterministic) is modelled")

    def costs(self, request: FleetRequest, views: Sequence[ReplicaView]) -> list[float]:
        s = self.settings
        bs = request.block_size
        incoming = -(-request.num_prompt_tokens // bs)
        out = []
        for v in views:
            raw = v.prefill_tokens / bs + incoming
            adjusted = max(raw - s["overlap_score_credit"] * v.overlap_blocks, 0.0)
            decode = (
                v.active_blocks
                + v.incoming_active_blocks
                + s["decode_active_request_weight"] * v.requests
            )
            out.append(s["prefill_load_scale"] * adjusted + decode)
        return out

    def choose(self, request, views):
        costs = self.costs(request, views)
        low = min(costs)
        ties = [v.index for v, c in zip(views, costs) if c == low]
        i = ties[0] if len(ties) == 1 else self._rng.choice(ties)
        return _base(
            self.name, i, "dynamo_lowest_cost", views, score_name="cost", score=tuple(costs)
        )

    @classmethod
    def why_fields(cls, decision, settings):
        d = decision
        return {
            **super().why_fields(d, settings),
            "costs": _listed(d.score, "{:g}"),
            "cost": f"{d.score[d.replica]:g}",
            "scale": f"{settings['prefill_load_scale']:g}",
            "credit": f"{settings['overlap_score_credit']:g}",
            "weight": f"{settings['decode_active_request_weight']:g}",
        }


@router("approx")
class ApproxTree(Router):
    """SGLang's cache-aware policy (sgl-router src/policies/cache_aware.rs, its header comment;
    defaults from sglang-router 0.3.2's router_args.py). The router keeps its own approximate
    tree of what it routed to each worker, never asking the workers:

    - imbalanced (max_load - min_load > balance_abs_threshold and
      max_load > balance_rel_threshold * min_load, load = requests in flight): the least loaded;
    - else the worker whose tree holds the longest prefix of the prompt when that match covers
      more than ``cache_threshold`` of the prompt; otherwise the worker with the smallest tree.

    The prompt is then inserted into the chosen worker's tree. Here the tree is kept in whole
    blocks (the prompt's block hashes; SGLang matches characters) and is never trimmed
    (SGLang evicts it to ``max_tree_size`` every ``eviction_interval_secs``)."""

    defaults = {"cache_threshold": 0.3, "balance_abs_threshold": 64, "balance_rel_threshold": 1.5}
    rules = ("approx_imbalanced", "approx_cache_hit", "approx_smallest_tree")

    @classmethod
    def check(cls, settings):
        _at_least(settings, ("cache_threshold", "balance_rel_threshold"))

    def __init__(self, settings: dict) -> None:
        super().__init__(settings)
        self._trees: list[dict[str, int]] = []  # per worker: block hash -> last routed at
        self._tick = 0

    def choose(self, request, views):
        s = self.settings
        n = len(views)
        while len(self._trees) < n:
            self._trees.append({})
        loads = [v.requests for v in views]
        hi, lo = max(loads), min(loads)
        match = []
        for t in self._trees[:n]:
            m = 0
            for h in request.block_hashes:
                if h not in t:
                    break
                m += 1
            match.append(m)
        tokens = max(request.num_prompt_tokens, 1)
        rates = [m * request.block_size / tokens for m in match]
        if hi - lo > s["balance_abs_threshold"] and hi > lo * s["balance_rel_threshold"]:
            i = loads.index(lo)
            rule = "approx_imbalanced"
        else:
            best = max(range(n), key=lambda j: (match[j], max(self._recent(j, request), 0), -j))
            if rates[best] > s["cache_threshold"]:
                i, rule = best, "approx_cache_hit"
            else:
                sizes = [len(t) for t in self._trees[:n]]
                i = sizes.index(min(sizes))
                rule = "approx_smallest_tree"
        self._tick += 1
        tree = self._trees[i]
        for h in request.block_hashes:
            tree[h] = self._tick
        return _base(
            self.name,
            i,
            rule,
            views,
            score_name="match_rate",
            score=tuple(rates),
            detail={"tree_blocks": [len(t) for t in self._trees[:n]]},
        )

    @classmethod
    def why_fields(cls, decision, settings):
        d, j = decision, decision.replica
        fields = super().why_fields(d, settings)
        rule = {
            "replica": j,
            "loads": fields["loads"],
            "rate": _percent(d.score[j]),
            "rates": ", ".join(_percent(x) for x in d.score),
            "threshold": _percent(settings["cache_threshold"]),
            "abs": settings["balance_abs_threshold"],
            "rel": f"{settings['balance_rel_threshold']:g}",
        }
        return {**fields, "rule": _rule(d, rule)}

    def _recent(self, j: int, request: FleetRequest) -> int:
        """When worker j last had the prompt's first block routed to it (the tree's tenant
        touched last wins a tie of equal matches)."""
        if not request.block_hashes:
            return -1
        return self._trees[j].get(request.block_hashes[0], -1)


def router_settings(overrides: Optional[dict] = None) -> dict:
    """The router settings: defaults, then ``overrides`` (checked, by every registered policy:
    RouterError names a bad one)."""
    defaults = router_defaults()
    out = dict(defaults)
    for k, v in (overrides or {}).items():
        if k not in defaults:
            raise RouterError(f"unknown router setting {k!r} (known: {', '.join(defaults)})")
        want = type(defaults[k])
        if want is float and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        if not isinstance(v, want) or isinstance(v, bool):
            raise RouterError(f"{k}: must be a {want.__name__}; got {v!r}")
        out[k] = v
    _at_least(out, ("kv_event_lag_ms", "kv_cache_block_size"))
    for cls in ROUTERS.values():
        cls.check(out)
    return out


def router_hasher(engine_hasher: RequestBlockHasher, settings: dict) -> RequestBlockHasher:
    """The hasher the router hashes prompts with: the engine's (``engine_hasher``), except where
    ``settings`` give the router another block size (``kv_cache_block_size``) or another root
    seed (``none_hash_seed``). Its hashes then name no block the engines published."""
    size = settings["kv_cache_block_size"] or engine_hasher.block_size
    seed = settings["none_hash_seed"] or engine_hasher.none_hash_seed
    if (size, seed) == (engine_hasher.block_size, engine_hasher.none_hash_seed):
        return engine_hasher
    return get_request_block_hasher(size, engine_hasher.hash_fn, none_hash_seed=seed)


def make_router(policy: str, settings: Optional[dict] = None) -> Router:
    """A fresh router of ``policy`` (one of ``policies()``) over checked settings."""
    return router_class(policy)(router_settings(settings))
