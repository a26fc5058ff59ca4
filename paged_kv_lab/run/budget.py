"""A resource budget, checked before a run allocates or computes anything.

Every way a run is created (a lesson's settings, the playground form, a pasted or
uploaded scenario, a packed link, a trace file, the CLI) asks ``check_scenario``
(and ``check_size`` for raw bytes) first. A refusal is a ``BudgetError`` whose
message names the quantity, its value, the limit and the knob that sets it, so a
visitor knows what was too big and an operator knows how to allow it. Its sentence is
a catalogue entry (text/catalogue/refusals.json): ``e.text`` renders it in the reader's
language, ``str(e)`` is the English one (logs, tracebacks).

The app's limits (``app_limits``) are strict and come from environment variables;
the CLI's (``cli_limits``) are generous but never above the memory this machine has
free. Pure Python: the model is described by its config object (duck-typed).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Mapping, Optional, Union

from kvcore.model.memory import bytes_per_block_dims, dtype_bytes, model_dims
from paged_kv_lab.run.scenario import prompt_text
from paged_kv_lab.text.i18n import Text, tr

Says = Union[str, Text]  # what a refusal names: a plain name (a setting's path) or a sentence


class BudgetError(ValueError):
    """A refused run: ``text`` the sentence (a catalogue ``Text``; ``str(e)`` is it in English),
    ``limit`` the knob's variable, ``value`` what was asked, ``allowed`` the limit."""

    def __init__(self, text: Text, limit: str = "", value: int = 0, allowed: int = 0) -> None:
        super().__init__(tr(text, "en"))
        self.text = text
        self.limit, self.value, self.allowed = limit, value, allowed


@dataclass(frozen=True)
class Limits:
    """Upper bounds for one run. Each field is set by the environment variable ``ENV[field]``."""

    max_run_bytes: int = 256 * 10**6  # KV-cache pool of one run
    max_num_gpu_blocks: int = 2048  # block-manager objects (and one BlockView per step each)
    max_block_size: int = 256
    max_prompt_chars: int = 8_000  # checked before tokenizing
    max_prompt_tokens: int = 2_048  # per request, after tokenizing
    max_tokens: int = 512  # per request
    max_requests: int = 32
    max_run_steps: int = 400  # steps one run may compute
    max_num_batched_tokens: int = 2_048
    max_activation_bytes: int = 512 * 10**6  # the largest prefill chunk's transient tensors
    # an uploaded / pasted / linked scenario (a link's: decompressed)
    max_file_bytes: int = 1 * 10**6
    # an uploaded trace file (one snapshot per step makes them large)
    max_trace_bytes: int = 32 * 10**6
    max_link_chars: int = 16_000  # the packed ``scn`` of a link, before decompression
    where: Text = Text("refusal.where.server")  # how refusals name the side that set the limit


ENV = {
    "max_run_bytes": "PAGED_KV_LAB_MAX_RUN_BYTES",
    "max_num_gpu_blocks": "PAGED_KV_LAB_MAX_BLOCKS",
    "max_block_size": "PAGED_KV_LAB_MAX_BLOCK_SIZE",
    "max_prompt_chars": "PAGED_KV_LAB_MAX_PROMPT_CHARS",
    "max_prompt_tokens": "PAGED_KV_LAB_MAX_PROMPT_TOKENS",
    "max_tokens": "PAGED_KV_LAB_MAX_TOKENS",
    "max_requests": "PAGED_KV_LAB_MAX_REQUESTS",
    "max_run_steps": "PAGED_KV_LAB_MAX_RUN_STEPS",
    "max_num_batched_tokens": "PAGED_KV_LAB_MAX_BATCHED_TOKENS",
    "max_activation_bytes": "PAGED_KV_LAB_MAX_ACTIVATION_BYTES",
    "max_file_bytes": "PAGED_KV_LAB_MAX_FILE_BYTES",
    "max_trace_bytes": "PAGED_KV_LAB_MAX_TRACE_BYTES",
    "max_link_chars": "PAGED_KV_LAB_MAX_LINK_CHARS",
}


# The scenario settings the budget bounds one by one: path in the scenario ("[]": any request) ->
# the Limits field. A number is bounded by its value, a prompt by its characters, token ids and
# the requests by how many (a request of n counts n). The playground's form and the tests read
# it, so a limit added here reaches both.
SETTING_LIMITS: dict[tuple[str, ...], str] = {
    ("engine", "num_gpu_blocks"): "max_num_gpu_blocks",
    ("engine", "block_size"): "max_block_size",
    ("engine", "max_num_batched_tokens"): "max_num_batched_tokens",
    ("engine", "cpu_offload", "num_cpu_blocks"): "max_num_gpu_blocks",  # a pool built the same way
    ("requests",): "max_requests",
    ("requests", "[]", "n"): "max_requests",
    ("requests", "[]", "max_tokens"): "max_tokens",
    ("requests", "[]", "arrival_step"): "max_run_steps",  # arrives before the last step
    ("requests", "[]", "prompt"): "max_prompt_chars",
    ("requests", "[]", "prompt_token_ids"): "max_prompt_tokens",
}


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        v = int(float(raw))
    except ValueError:
        raise BudgetError(Text("refusal.env.not_a_number", {"env": name, "raw": repr(raw)}), name)
    if v < 1:
        raise BudgetError(Text("refusal.env.below_one", {"env": name, "raw": repr(raw)}), name)
    return v


def app_limits(env: Mapping[str, str] | None = None) -> Limits:
    """The server's limits: the defaults above, each overridable by its environment variable."""
    env = os.environ if env is None else env
    base = Limits()
    return replace(base, **{f: _env_int(env, ENV[f], getattr(base, f)) for f in ENV})


def available_memory() -> int:
    """Bytes of memory this machine can still give (MemAvailable; else free pages)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 8 * 10**9


def cli_limits(available: int | None = None, env: Mapping[str, str] | None = None) -> Limits:
    """The CLI's limits: large, but the KV pool and one prefill's activations must each fit in
    half of the memory free now (a variable still lowers a limit)."""
    env = os.environ if env is None else env
    half = (available_memory() if available is None else int(available)) // 2
    generous = Limits(
        max_run_bytes=half,
        max_num_gpu_blocks=1_000_000,
        max_block_size=4096,
        max_prompt_chars=2_000_000,
        max_prompt_tokens=1_000_000,
        max_tokens=1_000_000,
        max_requests=10_000,
        max_run_steps=1_000_000,
        max_num_batched_tokens=1_000_000,
        max_activation_bytes=half,
        max_file_bytes=2 * 10**9,
        max_trace_bytes=2 * 10**9,
        max_link_chars=10**9,
        where=Text("refusal.where.machine"),
    )
    return replace(
        generous,
        **{f: min(getattr(generous, f), _env_int(env, ENV[f], getattr(generous, f))) for f in ENV},
    )


# -- arithmetic -------------------------------------------------------------------------
def fmt_bytes(n: float) -> str:
    for unit, size in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def kv_pool_bytes(config: Any, block_size: int, num_gpu_blocks: int, dtype: Any = "float32") -> int:
    """Bytes of the paged KV tensors of a pool (every layer, K and V)."""
    n_layers, n_kv, head_dim = model_dims(config)
    return int(num_gpu_blocks) * bytes_per_block_dims(block_size, n_layers, n_kv, head_dim, dtype)


def activation_bytes(
    config: Any, chunk_tokens: int, num_seqs: int, context: int, dtype: Any = "float32"
) -> int:
    """An upper estimate of one forward's transient memory for a step of ``chunk_tokens`` tokens
    over ``num_seqs`` sequences each seeing up to ``context`` keys.

    The paged attention pads every sequence to the longest query and the longest context and
    runs sdpa under a float mask, so scores are [seqs, heads, chunk, context] (and softmax makes
    a second copy); the linear layers hold a few [chunk, hidden] and [chunk, intermediate]
    tensors; logits are kept only for sampled positions (one per sequence).
    """
    _, n_kv, head_dim = model_dims(config)
    heads = int(config.num_attention_heads)
    hidden = int(config.hidden_size)
    inter = int(getattr(config, "intermediate_size", 4 * hidden))
    vocab = int(getattr(config, "vocab_size", 0))
    b = dtype_bytes(dtype)
    t, s, c = int(chunk_tokens), max(1, int(num_seqs)), int(context)
    scores = s * t * c * (heads * 4 * 2 + 4)  # two score copies + the additive mask
    gathered = s * c * heads * head_dim * 2 * b  # K and V gathered (GQA repeated)
    linear = t * (4 * hidden + 3 * inter) * b
    logits = s * vocab * 4
    return scores + gathered + linear + logits


# -- checks -----------------------------------------------------------------------------
def count(n: int, unit: Optional[Text] = None) -> Says:
    """``n`` with thousands separators, in ``unit`` (a ``refusal.unit.*`` Text) if one is given."""
    return Text(unit.key, {"n": f"{n:,}"}) if unit is not None else f"{n:,}"


def over(what: Says, value: Says, allowed: Says, where: Text, env: str) -> Text:
    """The refusal sentence "what = value; <where> at most allowed (env)" (no variable: none)."""
    fields = {"what": what, "value": value, "allowed": allowed, "where": where}
    if env:
        return Text("refusal.over", {**fields, "env": env})
    return Text("refusal.over_no_variable", fields)


def _refuse(
    what: Says, value: int, allowed: int, limits: Limits, field: str, unit: Optional[Text] = None
) -> BudgetError:
    text = over(what, count(value, unit), count(allowed, unit), limits.where, ENV[field])
    return BudgetError(text, ENV[field], value, allowed)


def check_size(nbytes: int, what: Says, limits: Limits, field: str = "max_file_bytes") -> None:
    """Refuse ``nbytes`` of raw input (a file, a pasted text, a decompressed link) over the
    limit."""
    allowed = getattr(limits, field)
    if nbytes > allowed:
        fields = {"what": what, "size": fmt_bytes(nbytes), "allowed": fmt_bytes(allowed)}
        text = Text("refusal.size", {**fields, "where": limits.where, "env": ENV[field]})
        raise BudgetError(text, ENV[field], nbytes, allowed)


def check_steps(steps: int, limits: Limits, what: Says = Text("refusal.what.trace_steps")) -> None:
    if steps > limits.max_run_steps:
        raise _refuse(what, steps, limits.max_run_steps, limits, "max_run_steps")


def check_scenario(
    scenario: Any,
    limits: Limits,
    config: Any = None,
    encode: Optional[Callable[[Any], list[int]]] = None,
) -> None:
    """Raise BudgetError if ``scenario`` (a kvcore Scenario) would exceed ``limits``.

    Without ``config`` (no model: block-manager studies) the model-dependent checks are skipped;
    ``encode(spec) -> token ids`` counts prompt tokens after the text length has passed.
    Order: cheap structural limits first, so nothing large is ever tokenized or allocated.
    """
    s = scenario.engine
    reqs = scenario.requests
    # sized from the machine's memory: a number is needed to check it
    if s.num_gpu_blocks == "auto":
        env = ENV["max_num_gpu_blocks"]
        raise BudgetError(Text("refusal.auto_blocks", {"env": env}), env)
    for path, field in SETTING_LIMITS.items():
        value = scenario
        for part in path if path[0] == "engine" else ():
            value = getattr(value, part, None)
        if isinstance(value, int) and value > getattr(limits, field):
            raise _refuse(".".join(path), value, getattr(limits, field), limits, field)
    cpu_offload = getattr(s, "cpu_offload", None)
    if cpu_offload is not None and cpu_offload.num_cpu_blocks > limits.max_num_gpu_blocks:
        # the CPU tier's pool is built like the GPU's: the same limit on its blocks
        raise _refuse(
            "engine.cpu_offload.num_cpu_blocks",
            cpu_offload.num_cpu_blocks,
            limits.max_num_gpu_blocks,
            limits,
            "max_num_gpu_blocks",
        )
    wanted = sum(getattr(r, "n", 1) for r in reqs)
    if wanted > limits.max_requests:
        what = Text("refusal.what.requests_counted")
        raise _refuse(what, wanted, limits.max_requests, limits, "max_requests")
    for i, r in enumerate(reqs):
        if r.max_tokens > limits.max_tokens:
            raise _refuse(
                f"requests[{i}].max_tokens", r.max_tokens, limits.max_tokens, limits, "max_tokens"
            )
        if r.arrival_step >= limits.max_run_steps:
            fields = {"what": f"requests[{i}].arrival_step", "value": f"{r.arrival_step:,}"}
            fields.update(allowed=f"{limits.max_run_steps:,}", where=limits.where)
            raise BudgetError(
                Text("refusal.arrival_step", {**fields, "env": ENV["max_run_steps"]}),
                ENV["max_run_steps"],
                r.arrival_step,
                limits.max_run_steps,
            )
        for path, text in _texts(i, r):
            if len(text) > limits.max_prompt_chars:
                raise _refuse(
                    Text("refusal.what.length", {"path": path}),
                    len(text),
                    limits.max_prompt_chars,
                    limits,
                    "max_prompt_chars",
                    Text("refusal.unit.characters"),
                )
        if r.prompt_token_ids is not None and len(r.prompt_token_ids) > limits.max_prompt_tokens:
            raise _refuse(
                Text("refusal.what.length", {"path": f"requests[{i}].prompt_token_ids"}),
                len(r.prompt_token_ids),
                limits.max_prompt_tokens,
                limits,
                "max_prompt_tokens",
                Text("refusal.unit.tokens"),
            )
    if config is None:
        return
    # the CPU tier holds a KV tensor pool of its own, of the same layout
    num_blocks = s.num_gpu_blocks + (cpu_offload.num_cpu_blocks if cpu_offload else 0)
    slots = num_blocks * s.block_size
    pool = kv_pool_bytes(config, s.block_size, num_blocks, scenario.dtype)
    sp = getattr(s, "speculative", None)
    if sp is not None and sp.method == "draft_model":
        # the draft model's layers hold GPU pools of their own, shaped like the target's
        n_layers = model_dims(config)[0]
        draft = min(n_layers, sp.num_draft_layers or max(1, n_layers * 3 // 4))
        gpu_pool = kv_pool_bytes(config, s.block_size, s.num_gpu_blocks, scenario.dtype)
        pool += gpu_pool * draft // n_layers
    if getattr(s, "kv_transfer", None) == "pd":
        pool *= 2  # a prefill replica and a decode replica, a pool each
    fleet = getattr(s, "fleet", None)
    if fleet is not None:
        pool *= fleet.replicas  # replicas behind a router, a pool each
    if pool > limits.max_run_bytes:
        what = "(num_gpu_blocks + cpu_offload.num_cpu_blocks)" if cpu_offload else "num_gpu_blocks"
        fields = {"blocks": f"engine.{what}", "slots": f"{slots:,}", "need": fmt_bytes(pool)}
        fields.update(allowed=fmt_bytes(limits.max_run_bytes), where=limits.where)
        raise BudgetError(
            Text("refusal.kv_pool", {**fields, "env": ENV["max_run_bytes"]}),
            ENV["max_run_bytes"],
            pool,
            limits.max_run_bytes,
        )
    lengths = []
    for i, r in enumerate(reqs):
        n = (
            len(r.prompt_token_ids)
            if r.prompt_token_ids is not None
            else (len(encode(r)) if encode is not None else len(prompt_text(r)))
        )
        if n > limits.max_prompt_tokens:
            raise _refuse(
                f"requests[{i}].prompt",
                n,
                limits.max_prompt_tokens,
                limits,
                "max_prompt_tokens",
                Text("refusal.unit.tokens"),
            )
        lengths.append(n)
    if not reqs:
        return
    longest = max(n + r.max_tokens for n, r in zip(lengths, reqs))
    context = min(longest, slots, s.max_model_len or longest)
    chunk = min(s.max_num_batched_tokens, sum(lengths) + sum(r.max_tokens for r in reqs))
    seqs = min(s.max_num_seqs, len(reqs))
    act = activation_bytes(config, chunk, seqs, context, scenario.dtype)
    if act > limits.max_activation_bytes:
        fields = {"chunk": f"{chunk:,}", "batched": f"{s.max_num_batched_tokens:,}"}
        fields.update(seqs=seqs, context=f"{context:,}", need=fmt_bytes(act))
        fields.update(allowed=fmt_bytes(limits.max_activation_bytes), where=limits.where)
        raise BudgetError(
            Text("refusal.activations", {**fields, "env": ENV["max_activation_bytes"]}),
            ENV["max_activation_bytes"],
            act,
            limits.max_activation_bytes,
        )


def prompt_encoder(model: Any) -> Optional[Callable[[Any], list[int]]]:
    """``encode`` for :func:`check_scenario`: a request's prompt tokens as the model makes them
    (its prompt, or the text its prompt embeddings embed); None without a model."""
    if getattr(model, "config", None) is None:
        return None

    def encode(r: Any) -> list[int]:
        return model.encode_prompt(prompt_text(r), r.chat)

    return encode


def _texts(i: int, r: Any) -> list[tuple[str, str]]:
    """(path, text) of each text request ``i`` is tokenized from: its prompt, its prompt
    embeddings' text, its multimodal items' texts."""
    out = [(f"requests[{i}].prompt", r.prompt)]
    embeds = getattr(r, "prompt_embeds", None)
    out.append((f"requests[{i}].prompt_embeds.text", embeds.text if embeds else None))
    for j, item in enumerate(getattr(r, "mm_features", ())):
        out.append((f"requests[{i}].mm_features[{j}].embeds.text", item.embeds.text))
    return [(path, text) for path, text in out if text is not None]


def limits_table() -> list[tuple[str, str, int]]:
    """(variable, field, default) for the README's table."""
    d = Limits()
    return [(ENV[f.name], f.name, getattr(d, f.name)) for f in fields(Limits) if f.name in ENV]
