"""The casebook: "Why is my hit rate ...?", questions users asked on vLLM's issue tracker, each
reproduced as a scenario on the real model.

A ``Case`` is data, like a lesson: the question as it was asked, the answer (vLLM 0.33.0's
behaviour, which ours follows), a link to the issue, and the scenario as a ``Lesson`` so the
lesson page's player, narration and "why?" panel play it unchanged. ``Fix`` is the case's "try
the fix" switch: the same scenario with some settings or requests changed. ``CLAIMS`` holds each
case's claim as a check over the two recorded runs (before and after the fix); the tests run every
check on the tiny model and on SmolLM2, so what the page says is what the engine does.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from paged_kv_lab.lesson.catalog import Lesson, Moment, Text
from paged_kv_lab.record.snapshot import Snapshot, StepRecord

VLLM = "vllm-project/vllm"


def issue_url(ref: str) -> str:
    """ "owner/repo#n" -> the issue's address on GitHub."""
    repo, n = ref.split("#")
    return f"https://github.com/{repo}/issues/{int(n)}"


@dataclass(frozen=True)
class Fix:
    """The switch "try the fix": settings and/or requests replaced in the case's scenario.
    ``requests`` (engine-format request dicts) replaces the whole list when given."""

    label: Text
    explain: Text
    engine: dict = field(default_factory=dict)
    requests: Optional[tuple[dict, ...]] = None
    moments: tuple[Moment, ...] = ()  # narration of the fixed run


@dataclass(frozen=True)
class Case:
    """One question and its reproduction. Invariant (tests/test_casebook.py): every key moment
    of ``lesson`` and of the fixed run happens, and ``CLAIMS[id]`` holds over the two runs."""

    id: str
    number: int
    icon: str
    title: Text  # the question, as users put it
    issue: str  # "owner/repo#n": the thread the question comes from
    asked: Text  # what was asked, in a few sentences
    answer: Text  # why, in vLLM 0.33.0 (and here)
    lesson: Lesson  # the scenario, its narration and "run until" kinds
    fix: Optional[Fix] = None
    figure: str = "hit_rate"  # the number the before/after figure compares (NUMBERS' keys)
    related: tuple[str, ...] = ()  # more threads asking the same ("owner/repo#n")

    @property
    def url(self) -> str:
        return issue_url(self.issue)

    def fixed_lesson(self) -> Optional[Lesson]:
        """The case's scenario with the fix applied, as a lesson of its own (its own id, so the
        page keeps the two runs apart)."""
        if self.fix is None:
            return None
        scenario = copy.deepcopy(self.lesson.scenario)
        scenario["name"] = scenario.get("name", self.id) + "-fixed"
        scenario.setdefault("engine", {}).update(copy.deepcopy(self.fix.engine))
        if self.fix.requests is not None:
            scenario["requests"] = [copy.deepcopy(r) for r in self.fix.requests]
        return dataclasses.replace(
            self.lesson, id=self.lesson.id + "-fixed", scenario=scenario, moments=self.fix.moments
        )


# -- the numbers a case shows, from a run's last snapshot ----------------------------------
def numbers(snap: Snapshot) -> dict[str, float]:
    """Hit counters as vLLM 0.33.0 keeps them (PrefixCacheStats since the last reset), and the
    rate as it was counted before vLLM #25787 (resumed requests' hits included)."""
    pc = snap.prefix_cache
    hits, queries = int(pc.get("hits", 0)), int(pc.get("queries", 0))
    p_hits, p_queries = int(pc.get("preempted_hits", 0)), int(pc.get("preempted_queries", 0))
    return {
        "hits": hits,
        "queries": queries,
        "hit_rate": hits / queries if queries else 0.0,
        "preempted_hits": p_hits,
        "preempted_queries": p_queries,
        "hit_rate_with_preempted": (
            (hits + p_hits) / (queries + p_queries) if queries + p_queries else 0.0
        ),
        "usage": snap.usage,
        "cached_blocks": sum(1 for b in snap.blocks if b.block_hash is not None),
    }


# -- claims: (records before, records after the fix) -> problems (empty: the claim holds) ----
Records = Sequence[StepRecord]


def _events(records: Records, kind: str, request: Optional[str] = None):
    return [
        (rec, e)
        for rec in records
        for e in rec.events
        if e.kind == kind and (request is None or e.request_id == request)
    ]


def _last(records: Records) -> Snapshot:
    return records[-1].snapshot


def _hit_tokens(records: Records, request: str) -> int:
    return sum(e.num_tokens for _, e in _events(records, "cache_hit", request))


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _claim_short_prefix(before: Records, after: Records) -> list[str]:
    out = []
    snap = _last(before)
    a, b = snap.request("A").prompt_token_ids, snap.request("B").prompt_token_ids
    shared = _common_prefix(a, b)
    if not 0 < shared < snap.block_size:
        out.append(f"the shared prefix ({shared} tokens) should be shorter than one block")
    if numbers(snap)["hits"] != 0 or numbers(snap)["queries"] == 0:
        out.append("before the fix: tokens were queried and none hit")
    fixed = _last(after)
    if not fixed.block_size <= shared or numbers(fixed)["hits"] <= 0:
        out.append("after the fix: the smaller block fits in the shared prefix and hits")
    return out


def _claim_sliding_churn(before: Records, after: Records) -> list[str]:
    out = []
    if _hit_tokens(before, "A2") != 0:
        out.append("dense retention: session A's second turn should find nothing")
    if not any(e.block_hash for _, e in _events(before, "evicted")):
        out.append("dense retention: cached blocks should be evicted by the churn")
    if _hit_tokens(after, "A2") <= 0:
        out.append("sparse retention: session A's second turn should hit its kept tail")
    return out


def _claim_preempted_hits(before: Records, after: Records) -> list[str]:
    out = []
    pre = _events(before, "preempted")
    if not pre:
        return ["nothing was preempted"]
    victim = pre[0][1].request_id
    if not any(e.preempted_before for _, e in _events(before, "cache_hit", victim)):
        out.append(f"{victim} should resume with a hit on its own recomputed blocks")
    n = numbers(_last(before))
    if n["preempted_hits"] <= 0:
        out.append("the resumed request's hits should be counted (as preempted hits)")
    if n["hits"] != 0:
        out.append("no prompt shares a prefix: vLLM 0.33.0's hit rate should be 0")
    if not n["hit_rate_with_preempted"] > 0:
        out.append("counted as before vLLM #25787, the hit rate should be above 0")
    fixed = numbers(_last(after))
    if _events(after, "preempted") or fixed["preempted_hits"] or fixed["hit_rate_with_preempted"]:
        out.append("with enough blocks: no preemption and no recomputed 'hits'")
    return out


def _claim_salt(before: Records, after: Records) -> list[str]:
    out = []
    if _hit_tokens(before, "A2") <= 0:
        out.append("tenant A's second request (same salt) should hit")
    if _hit_tokens(before, "B1") != 0 or not _events(before, "cache_miss", "B1"):
        out.append("tenant B (another salt) should miss A's cached prompt")
    if _hit_tokens(after, "B1") <= 0:
        out.append("with one shared salt, B should hit A's blocks")
    return out


def _claim_usage_zero(before: Records, after: Records) -> list[str]:
    out = []
    idle = [
        r
        for r in before
        if r.snapshot.usage == 0.0 and not r.snapshot.running and not r.snapshot.waiting
    ]
    if not idle:
        out.append("usage should drop to 0% once A finished")
    elif not any(b.block_hash for b in idle[0].snapshot.blocks):
        out.append("at 0% usage, A's blocks should still be cached (hashed, in the free queue)")
    if _hit_tokens(before, "B") <= 0:
        out.append("B, arriving later, should hit A's blocks")
    idle_off = [r for r in after if r.snapshot.usage == 0.0 and not r.snapshot.running]
    if not idle_off or _hit_tokens(after, "B") != 0:
        out.append("with prefix caching off: the same 0% usage, and B finds nothing")
    return out


def _claim_timestamp(before: Records, after: Records) -> list[str]:
    out = []
    snap = _last(before)
    if any(_hit_tokens(before, r.request_id) for r in snap.requests):
        out.append("with the timestamp first, no request should hit")
    fixed = _last(after)
    later = [r.request_id for r in fixed.requests][1:]
    if not later or not all(_hit_tokens(after, r) > 0 for r in later):
        out.append("with the stable part first, every later request should hit")
    return out


CLAIMS: dict[str, Callable[[Records, Records], list[str]]] = {
    "short-prefix": _claim_short_prefix,
    "sliding-churn": _claim_sliding_churn,
    "preempted-hits": _claim_preempted_hits,
    "cache-salt": _claim_salt,
    "usage-zero": _claim_usage_zero,
    "timestamp-first": _claim_timestamp,
}


# -- the cases -----------------------------------------------------------------------------
def _chat(system: str, user: str) -> str:
    """A prompt rendered as SmolLM2's chat template renders one system + one user turn."""
    return (
        f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def _case_lesson(case_id: str, icon: str, title: Text, **kw) -> Lesson:
    """A case's scenario as a lesson, for the player; its id names the case ("case-<id>")."""
    return Lesson(id=f"case-{case_id}", number=0, icon=icon, title=title, summary=title, **kw)


_SHORT_PREFIX_REQUESTS = (
    {"id": "A", "prompt": "What is a KV cache?", "chat": True, "max_tokens": 3, "ignore_eos": True},
    {
        "id": "B",
        "prompt": "Name three colors.",
        "chat": True,
        "max_tokens": 3,
        "arrival_step": 2,
        "ignore_eos": True,
    },
)

SHORT_PREFIX = Case(
    id="short-prefix",
    number=1,
    icon="📏",
    title={
        "en": "Why is my hit rate exactly 0% when every request shares the system prompt?",
        "zh": "为什么每个请求都共享系统提示词，命中率却正好是 0%？",
    },
    issue=f"{VLLM}#54607",
    related=(f"{VLLM}#47430",),
    asked={
        "en": "A user compared engines on the same traffic: vLLM reported 0 prefix-cache hits, "
        "another engine about 49%. The shared system prompt was about 240 tokens; the model's "
        "KV block on vLLM was 784 tokens.",
        "zh": "有用户在相同流量上比较多个推理引擎：vLLM 报告的前缀缓存命中为 0，"
        "另一个引擎约 49%。共享的系统提示词约 240 个 token，"
        "而该模型在 vLLM 上的 KV 块是 784 个 token。",
    },
    answer={
        "en": "Both numbers were right. vLLM hashes and caches only **full** blocks, and a lookup "
        "matches whole blocks from the first one on. A shared prefix shorter than one block "
        "never fills a block, so no hash of the second request can equal one of the first: "
        "`queries > 0, hits = 0`. Check the block size the engine actually uses (hybrid models "
        "may raise it far above 16); a block no longer than the shared prefix lets it hit.",
        "zh": "两个数字都没错。vLLM 只对**满**块计算哈希并缓存，查找从第一个块开始按整块匹配。"
        "比一个块还短的共享前缀永远填不满一个块，所以第二个请求的任何哈希都不会等于第一个请求的："
        "`queries > 0，hits = 0`。请检查引擎实际使用的块大小（混合模型可能把它调到远大于 16）；"
        "块不比共享前缀长时，前缀才能命中。",
    },
    lesson=_case_lesson(
        "short-prefix",
        "📏",
        {"en": "Shared prefix shorter than a block", "zh": "共享前缀短于一个块"},
        scenario={
            "name": "case-short-prefix",
            "description": "Two chat requests share SmolLM2's system prompt (under 32 tokens); "
            "the blocks hold 32 tokens.",
            "model": "smollm2",
            "engine": {
                "block_size": 32,
                "num_gpu_blocks": 12,
                "max_num_seqs": 4,
                "max_num_batched_tokens": 128,
            },
            "requests": list(_SHORT_PREFIX_REQUESTS),
        },
        intro={
            "en": "A and B go through the same chat template, so their first tokens (the system "
            "prompt) are the same. The blocks hold {block_size} tokens.",
            "zh": "A 和 B 经过同一个对话模板，所以开头的 token（系统提示词）相同。"
            "每个块装 {block_size} 个 token。",
        },
        moments=(
            Moment(
                "cache_miss",
                request="B",
                text={
                    "en": "B misses: the part it shares with A ends before the first block is "
                    "full, so B's first block hash already differs from A's. Hit rate: 0%.",
                    "zh": "B 未命中：它与 A 共享的部分在第一个块装满之前就结束了，"
                    "所以 B 的第一个块哈希就已与 A 的不同。命中率：0%。",
                },
            ),
        ),
        focus=("cache_miss", "cache_hit"),
    ),
    fix=Fix(
        label={"en": "Try the fix: block_size 8", "zh": "试试修复：block_size 8"},
        explain={
            "en": "Smaller blocks: the shared system prompt now spans whole blocks, and B hits "
            "them.",
            "zh": "更小的块：共享的系统提示词现在覆盖若干整块，B 命中了它们。",
        },
        engine={"block_size": 8, "num_gpu_blocks": 48},
        moments=(
            Moment(
                "cache_hit",
                request="B",
                text={
                    "en": "With {block_size}-token blocks, B hits {num_tokens} tokens of the "
                    "shared system prompt: every full block of it.",
                    "zh": "块大小为 {block_size} 时，B 命中了共享系统提示词中的 {num_tokens} "
                    "个 token：其中的每一个满块。",
                },
            ),
        ),
    ),
)


_SESSIONS = {
    "A": "Session A. We are planning a garden with tomatoes, beans and basil along the "
    "south fence.",
    "B": "Session B. The quarterly report covers sales in three regions and the hiring plan.",
    "C": "Session C. Our hiking trip starts at the lake and climbs to the ridge before noon.",
}

SLIDING_CHURN = Case(
    id="sliding-churn",
    number=2,
    icon="🪟",
    title={
        "en": "Why do sliding-window hits collapse when several sessions take turns?",
        "zh": "为什么多个会话轮流发送时，滑动窗口的命中会全部消失？",
    },
    issue=f"{VLLM}#48435",
    asked={
        "en": "On a hybrid model with sliding-window layers (Gemma), prefix caching fell to "
        "zero for every request once a few long sessions were served round-robin, with the "
        "pool only about a quarter full.",
        "zh": "在带滑动窗口层的混合模型（Gemma）上，几个长会话轮流发送时，"
        "所有请求的前缀缓存命中都降到了零，而块池只用了大约四分之一。",
    },
    answer={
        "en": "With dense retention (`prefix_cache_retention_interval` unset, the old default), "
        "every full block of a sliding-window group keeps its hash. Blocks that leave the "
        "window are freed as the request decodes and, being hashed, join the free queue's "
        "**tail**; the decoding sessions then allocate from the head and evict the cached "
        "tails the other sessions need. A sliding-window hit needs the window's worth of "
        "blocks right before where it stops, so one evicted block there loses the hit. "
        "vLLM 0.33.0's default is sparse retention (interval 0): only blocks a later request "
        "can hit keep a hash, the rest are freed to the **head** and reused first, and the "
        "kept tails survive the churn (vLLM #43447, #52216).",
        "zh": "稠密保留（`prefix_cache_retention_interval` 未设置，旧默认值）时，"
        "滑动窗口组的每个满块都保留哈希。滑出窗口的块在请求解码时被释放，"
        "因为带哈希而进入空闲队列**尾部**；正在解码的会话再从队头分配，"
        "把其他会话需要的缓存尾块驱逐掉。滑动窗口命中需要停止位置之前整整一个窗口的块，"
        "其中任一块被驱逐就命中不了。vLLM 0.33.0 的默认值是稀疏保留（间隔 0）："
        "只有之后的请求可能命中的块保留哈希，其余块释放到**队头**、最先被复用，"
        "保留下来的尾块就能挺过这种翻腾（vLLM #43447、#52216）。",
    },
    lesson=_case_lesson(
        "sliding-churn",
        "🪟",
        {"en": "Sliding-window hits under interleaved sessions", "zh": "交错会话下的滑动窗口命中"},
        scenario={
            "name": "case-sliding-churn",
            "description": "Every layer attends to the last 8 tokens; dense retention. Three "
            "sessions take turns; session A sends its prompt again while B and C decode.",
            "model": "smollm2",
            "engine": {
                "block_size": 4,
                "num_gpu_blocks": 20,
                "sliding_window": 8,
                "max_num_seqs": 3,
                "max_num_batched_tokens": 64,
                "prefix_cache_retention_interval": None,
            },
            "requests": [
                {"id": "A1", "prompt": _SESSIONS["A"], "max_tokens": 6, "ignore_eos": True},
                {
                    "id": "B1",
                    "prompt": _SESSIONS["B"],
                    "max_tokens": 16,
                    "arrival_step": 1,
                    "ignore_eos": True,
                },
                {
                    "id": "C1",
                    "prompt": _SESSIONS["C"],
                    "max_tokens": 16,
                    "arrival_step": 2,
                    "ignore_eos": True,
                },
                {
                    "id": "A2",
                    "prompt": _SESSIONS["A"],
                    "max_tokens": 4,
                    "arrival_step": 14,
                    "ignore_eos": True,
                },
            ],
        },
        intro={
            "en": "Every layer attends to the last {sliding_window} tokens, and every full block "
            "keeps its hash (dense retention). Session A finishes first; B and C keep decoding; "
            "then A sends the same prompt again (A2).",
            "zh": "每一层只关注最近 {sliding_window} 个 token，且每个满块都保留哈希（稠密保留）。"
            "会话 A 先结束；B 和 C 继续解码；然后 A 再次发送同一个提示词（A2）。",
        },
        moments=(
            Moment(
                "evicted",
                text={
                    "en": "The decoding sessions take blocks from the head of the free queue, "
                    "and that evicts cached blocks: the churn of sliding-window blocks pushes "
                    "other sessions' hashes out.",
                    "zh": "正在解码的会话从空闲队列队头取块，于是驱逐了带缓存的块："
                    "滑动窗口块的翻腾把其他会话的哈希挤了出去。",
                },
            ),
            Moment(
                "cache_miss",
                request="A2",
                text={
                    "en": "A2 is A's prompt again, and it misses: the blocks right before where "
                    "its hit would stop were evicted.",
                    "zh": "A2 又是 A 的提示词，却未命中：它的命中停止位置之前的那些块已被驱逐。",
                },
            ),
        ),
        focus=("evicted", "cache_hit", "cache_miss", "window_skipped"),
        panels=("held",),
    ),
    fix=Fix(
        label={
            "en": "Try the fix: sparse retention (interval 0, vLLM 0.33.0's default)",
            "zh": "试试修复：稀疏保留（间隔 0，vLLM 0.33.0 默认）",
        },
        explain={
            "en": "Only the blocks a later request can hit keep a hash; the others are freed "
            "to the head and reused first, so session A's kept tail survives.",
            "zh": "只有之后的请求可能命中的块保留哈希；其余块释放到队头、最先被复用，"
            "于是会话 A 保留的尾块活了下来。",
        },
        engine={"prefix_cache_retention_interval": 0},
        moments=(
            Moment(
                "freed",
                where="to_head",
                text={
                    "en": "Blocks that left the window and keep no hash go to the **head** of "
                    "the free queue: they are the first to be reused.",
                    "zh": "滑出窗口且不保留哈希的块进入空闲队列**队头**：它们最先被复用。",
                },
            ),
            Moment(
                "cache_hit",
                request="A2",
                text={
                    "en": "A2 hits {num_tokens} tokens: the tail A kept is still cached, and "
                    "the blocks before it are outside the window (∅).",
                    "zh": "A2 命中了 {num_tokens} 个 token：A 保留的尾块仍在缓存中，"
                    "更早的块在窗口之外（∅）。",
                },
            ),
        ),
    ),
)


PREEMPTED_HITS = Case(
    id="preempted-hits",
    number=3,
    icon="♻️",
    title={
        "en": "Why does a random-prompt benchmark show a 30% hit rate?",
        "zh": "为什么随机提示词的压测会显示 30% 的命中率？",
    },
    issue=f"{VLLM}#25780",
    asked={
        "en": "`vllm bench throughput` on a random dataset (no shared prefixes at all) logged a "
        "prefix-cache hit rate of about 32% while the KV cache was full and requests waited.",
        "zh": "在随机数据集（完全没有共享前缀）上运行 `vllm bench throughput`，"
        "KV 缓存已满、请求在排队时，日志里的前缀缓存命中率约为 32%。",
    },
    answer={
        "en": "The hits were the engine's own recomputation. A preempted request loses its "
        "blocks but their hashes stay in the free queue; when it is scheduled again, its "
        "lookup finds its own blocks and counts them as hits. Since vLLM #25787 (in 0.33.0) "
        "a request with `num_preemptions > 0` is counted apart (`preempted_queries`, "
        "`preempted_hits`) and the logged hit rate leaves it out. The switch shows the "
        "fix for the workload itself: enough blocks, so nothing is preempted or recomputed.",
        "zh": "这些命中其实是引擎自己的重算。被抢占的请求失去了它的块，但块的哈希还留在空闲队列里；"
        "它再次被调度时，查找会找到自己的块，并把它们算作命中。自 vLLM #25787（0.33.0 已包含）起，"
        "`num_preemptions > 0` 的请求单独计数（`preempted_queries`、`preempted_hits`），"
        "日志里的命中率不再包含它。开关展示的是对负载本身的修复：块足够多，"
        "就不会有抢占和重算。",
    },
    figure="hit_rate_with_preempted",
    lesson=_case_lesson(
        "preempted-hits",
        "♻️",
        {"en": "Recomputation after preemption", "zh": "抢占之后的重算"},
        scenario={
            "name": "case-preempted-hits",
            "description": "Three unrelated prompts decode on a 14-block pool until it runs "
            "dry; C is preempted and resumes.",
            "model": "smollm2",
            "engine": {
                "block_size": 4,
                "num_gpu_blocks": 14,
                "max_num_seqs": 3,
                "max_num_batched_tokens": 64,
            },
            "requests": [
                {
                    "id": "A",
                    "prompt": "The quick brown fox",
                    "max_tokens": 10,
                    "ignore_eos": True,
                },
                {
                    "id": "B",
                    "prompt": "Roses are red, violets are blue, sugar is sweet,",
                    "max_tokens": 16,
                    "ignore_eos": True,
                },
                {
                    "id": "C",
                    "prompt": "Count with me: one, two, three,",
                    "max_tokens": 14,
                    "ignore_eos": True,
                },
            ],
        },
        intro={
            "en": "Three prompts with nothing in common decode on a pool of {num_gpu_blocks} "
            "blocks. Any hit you see here cannot come from a shared prefix.",
            "zh": "三个毫无共同之处的提示词在一个只有 {num_gpu_blocks} 个块的块池上解码。"
            "这里出现的任何命中都不可能来自共享前缀。",
        },
        moments=(
            Moment(
                "preempted",
                text={
                    "en": "The pool ran dry: {req} is preempted. Its blocks return to the free "
                    "queue, still hashed.",
                    "zh": "块池耗尽：{req} 被抢占。它的块回到空闲队列，哈希仍在。",
                },
            ),
            Moment(
                "cache_hit",
                where="self_hit",
                text={
                    "en": "{req} is scheduled again and hits {num_tokens} tokens: its own "
                    "blocks. vLLM 0.33.0 counts them as preempted hits, outside the hit rate; "
                    "before #25787 they raised the logged rate.",
                    "zh": "{req} 再次被调度，命中了 {num_tokens} 个 token：都是它自己的块。"
                    "vLLM 0.33.0 把它们计为被抢占请求的命中，"
                    "不计入命中率；#25787 之前它们会抬高日志里的命中率。",
                },
            ),
        ),
        focus=("preempted", "cache_hit", "resumed"),
    ),
    fix=Fix(
        label={"en": "Try the fix: 32 blocks (no preemption)", "zh": "试试修复：32 个块（无抢占）"},
        explain={
            "en": "With enough blocks nothing is preempted, nothing is recomputed, and the "
            "pre-#25787 count falls to the true 0%.",
            "zh": "块足够多时没有抢占、没有重算，#25787 之前的计数也降到真实的 0%。",
        },
        engine={"num_gpu_blocks": 32},
        moments=(
            Moment(
                "finished",
                request="B",
                text={
                    "en": "B finished without anyone being preempted: no recomputation, no "
                    "self-hits.",
                    "zh": "B 完成了，期间没有任何请求被抢占：没有重算，也没有“自己命中自己”。",
                },
            ),
        ),
    ),
)


CACHE_SALT = Case(
    id="cache-salt",
    number=4,
    icon="🧂",
    title={
        "en": "Why does the same prompt hit for one tenant and miss for another?",
        "zh": "为什么同一个提示词，对一个租户命中，对另一个租户却未命中？",
    },
    issue=f"{VLLM}#16016",
    asked={
        "en": "An RFC: in a shared deployment, an attacker can time the first token to learn "
        "whether a guessed prefix is already cached for someone else. It proposed a "
        "`cache_salt` per request so that only requests with the same salt share blocks.",
        "zh": "一份 RFC：在共享部署中，攻击者可以测量首 token 延迟，"
        "推断猜测的前缀是否已被他人缓存。"
        "它提议为每个请求加 `cache_salt`，只有盐相同的请求才共享块。",
    },
    answer={
        "en": "vLLM (#17045) puts the salt into the extra keys of the **first** block's hash. "
        "Every later hash is chained from it, so a different salt changes the whole chain: "
        "tenant B's identical prompt misses, while tenant A's own requests still hit each "
        "other. The isolation costs hits; requests that may share (one tenant, or a trusted "
        "group) should carry one salt.",
        "zh": "vLLM（#17045）把盐放进**第一个**块哈希的额外键。之后的每个哈希都从它链下来，"
        "所以盐不同，整条链都不同：租户 B 完全相同的提示词未命中，而租户 A 自己的请求仍能互相命中。"
        "隔离的代价是命中；可以共享的请求（同一租户，或一个可信的组）应使用同一个盐。",
    },
    lesson=_case_lesson(
        "cache-salt",
        "🧂",
        {"en": "cache_salt isolates tenants", "zh": "cache_salt 隔离租户"},
        scenario={
            "name": "case-cache-salt",
            "description": "Tenant A sends two chat requests with salt tenant-a; tenant B sends "
            "A's first prompt with salt tenant-b.",
            "model": "smollm2",
            "engine": {
                "block_size": 8,
                "num_gpu_blocks": 48,
                "max_num_seqs": 4,
                "max_num_batched_tokens": 128,
            },
            "requests": [
                {
                    "id": "A1",
                    "prompt": "What is a KV cache?",
                    "chat": True,
                    "max_tokens": 3,
                    "cache_salt": "tenant-a",
                    "ignore_eos": True,
                },
                {
                    "id": "A2",
                    "prompt": "Name three colors.",
                    "chat": True,
                    "max_tokens": 3,
                    "cache_salt": "tenant-a",
                    "arrival_step": 2,
                    "ignore_eos": True,
                },
                {
                    "id": "B1",
                    "prompt": "What is a KV cache?",
                    "chat": True,
                    "max_tokens": 3,
                    "cache_salt": "tenant-b",
                    "arrival_step": 2,
                    "ignore_eos": True,
                },
            ],
        },
        intro={
            "en": "Tenant A's requests carry `cache_salt=\"tenant-a\"`; tenant B's carries "
            '`"tenant-b"`. B1 is word for word A1.',
            "zh": '租户 A 的请求带 `cache_salt="tenant-a"`；租户 B 的请求带 `"tenant-b"`。'
            "B1 与 A1 一字不差。",
        },
        moments=(
            Moment(
                "cache_hit",
                request="A2",
                text={
                    "en": "A2, same tenant and same salt, hits {num_tokens} tokens of the "
                    "system prompt A1 cached.",
                    "zh": "A2 同一租户、同一个盐，"
                    "命中了 A1 缓存的系统提示词中的 {num_tokens} 个 token。",
                },
            ),
            Moment(
                "cache_miss",
                request="B1",
                text={
                    "en": "B1 is A1's prompt token for token, yet it misses: its salt changed "
                    "the first block's hash and so every hash after it.",
                    "zh": "B1 与 A1 的提示词逐 token 相同，却未命中：它的盐改变了第一个块的哈希，"
                    "也就改变了之后的每一个哈希。",
                },
            ),
        ),
        focus=("cache_hit", "cache_miss"),
    ),
    fix=Fix(
        label={"en": "Try the fix: one shared salt", "zh": "试试修复：共用一个盐"},
        explain={
            "en": "Requests allowed to share (here: one trusted team) carry the same salt, so "
            "they share blocks again; other salts stay isolated.",
            "zh": "允许共享的请求（这里是一个可信团队）带同一个盐，"
            "于是又能共享块；其他盐仍然隔离。",
        },
        requests=tuple(
            {
                "id": rid,
                "prompt": prompt,
                "chat": True,
                "max_tokens": 3,
                "cache_salt": "team-1",
                "arrival_step": step,
                "ignore_eos": True,
            }
            for rid, prompt, step in (
                ("A1", "What is a KV cache?", 0),
                ("A2", "Name three colors.", 2),
                ("B1", "What is a KV cache?", 2),
            )
        ),
        moments=(
            Moment(
                "cache_hit",
                request="B1",
                text={
                    "en": "With one shared salt, B1 hits {num_tokens} tokens of A1's blocks.",
                    "zh": "共用一个盐后，B1 命中了 A1 块中的 {num_tokens} 个 token。",
                },
            ),
        ),
    ),
)


USAGE_ZERO = Case(
    id="usage-zero",
    number=5,
    icon="0️⃣",
    title={
        "en": "KV usage drops to 0% when the request finishes: is the cache gone?",
        "zh": "请求一结束 KV 使用率就降到 0%：缓存没了吗？",
    },
    issue=f"{VLLM}#9660",
    related=(f"{VLLM}#5176", f"{VLLM}#12077"),
    asked={
        "en": "Users watching `GPU KV cache usage` saw it fall to 0% as soon as their requests "
        "were done and concluded that prefix caching kept nothing for the next request.",
        "zh": "用户观察 `GPU KV cache usage`，看到请求一完成它就降到 0%，"
        "于是认为前缀缓存没有为下一个请求保留任何东西。",
    },
    answer={
        "en": "Usage counts the blocks requests hold: `1 − free blocks / usable blocks` "
        "(`BlockPool.get_usage`). A finished request's blocks return to the free queue "
        "**with their hashes**: free, so usage is 0%, but still cached until a new allocation "
        "evicts them. The next request with the same prefix finds them with `touch` and takes "
        "them back. To see whether the cache works, read the hit counters "
        "(`prefix_cache_queries`, `prefix_cache_hits`), not usage.",
        "zh": "使用率统计的是请求持有的块：`1 − 空闲块 / 可用块`（`BlockPool.get_usage`）。"
        "已完成请求的块**连同哈希**回到空闲队列：它们是空闲的，所以使用率为 0%，"
        "但在新的分配驱逐它们之前仍然有缓存。下一个前缀相同的请求用 `touch` 找到并取回它们。"
        "要判断缓存是否生效，请看命中计数（`prefix_cache_queries`、"
        "`prefix_cache_hits`），而不是使用率。",
    },
    lesson=_case_lesson(
        "usage-zero",
        "0️⃣",
        {"en": "0% usage, a full cache", "zh": "使用率 0%，缓存却是满的"},
        scenario={
            "name": "case-usage-zero",
            "description": "A runs and finishes; the engine idles; B sends the same prompt.",
            "model": "smollm2",
            "engine": {
                "block_size": 8,
                "num_gpu_blocks": 32,
                "max_num_seqs": 4,
                "max_num_batched_tokens": 128,
            },
            "requests": [
                {
                    "id": "A",
                    "prompt": "What is a KV cache?",
                    "chat": True,
                    "max_tokens": 3,
                    "ignore_eos": True,
                },
                {
                    "id": "B",
                    "prompt": "What is a KV cache?",
                    "chat": True,
                    "max_tokens": 3,
                    "arrival_step": 6,
                    "ignore_eos": True,
                },
            ],
        },
        intro={
            "en": "Watch the usage line in the charts and the hashes in the pool: A runs, "
            "finishes, the engine idles, then B sends the same prompt.",
            "zh": "请同时观察图表中的使用率曲线和块池中的哈希：A 运行并完成，引擎空闲，"
            "然后 B 发送同一个提示词。",
        },
        moments=(
            Moment(
                "freed",
                request="A",
                where="to_tail",
                text={
                    "en": "A finished. Its blocks {blocks} are free, so usage reads 0%, but the "
                    "full ones keep their hashes at the tail of the free queue: the cache is "
                    "still there.",
                    "zh": "A 完成了。它的块 {blocks} 空闲了，所以使用率显示 0%，"
                    "但满块仍带着哈希留在空闲队列尾部：缓存还在。",
                },
            ),
            Moment(
                "cache_hit",
                request="B",
                text={
                    "en": "B hits {num_tokens} tokens: `touch` took A's free cached blocks "
                    "back out of the queue. Usage rises again, and the hit counters show the "
                    "cache working.",
                    "zh": "B 命中了 {num_tokens} 个 token："
                    "`touch` 把 A 空闲但有缓存的块从队列中取了回来。"
                    "使用率重新上升，命中计数表明缓存在起作用。",
                },
            ),
        ),
        focus=("cache_hit", "finished"),
    ),
    fix=Fix(
        label={
            "en": "Compare: prefix caching off (a cache that is really empty)",
            "zh": "对比：关闭前缀缓存（真正空的缓存）",
        },
        explain={
            "en": "Usage falls to 0% exactly the same way, but now B computes everything: "
            "usage cannot tell the two apart, the hit counters can.",
            "zh": "使用率同样降到 0%，但现在 B 要全部重新计算："
            "使用率分不清这两种情况，命中计数可以。",
        },
        engine={"enable_prefix_caching": False},
        moments=(
            Moment(
                "freed",
                request="A",
                text={
                    "en": "A finished and its blocks {blocks} are free: 0% usage again, but "
                    "without hashes nothing can be found later.",
                    "zh": "A 完成了，它的块 {blocks} 空闲了："
                    "使用率同样是 0%，但没有哈希，之后什么也找不到。",
                },
            ),
        ),
    ),
)


_STABLE = (
    "You are the help desk of a bicycle shop. Answer in two sentences, and ask about the "
    "bike before you suggest a repair."
)
_VISITS = (
    ("U1", "09:14:03", "4812", "My brakes squeak.", 0),
    ("U2", "09:15:41", "7730", "The chain keeps slipping.", 2),
    ("U3", "09:17:12", "2291", "How often should I oil the chain?", 4),
)

TIMESTAMP_FIRST = Case(
    id="timestamp-first",
    number=6,
    icon="🕒",
    title={
        "en": "Why does nothing hit when the system prompt differs only in the time?",
        "zh": "为什么系统提示词只有时间不同，却什么都命中不了？",
    },
    issue="home-assistant/core#133687",
    asked={
        "en": "Not from vLLM's tracker, but the same question every vLLM chat deployment meets: "
        "Home Assistant's prompt for a local LLM began with the knowledge-cutoff line, then "
        '"Current time is 20:37:19. Today\'s date is 2024-12-20.", then a long, unchanging '
        "list of instructions and devices. Its reporter asked why the prompt cache never "
        "helped.",
        "zh": "这个问题不是来自 vLLM 的问题列表，但每个基于 vLLM 的聊天部署都会遇到："
        "Home Assistant 发给本地大模型的提示词先是知识截止日期一行，"
        "接着是“Current time is 20:37:19. Today's date is 2024-12-20.”，"
        "然后才是一长串不变的说明和设备列表。报告者问：为什么提示词缓存从来不起作用。",
    },
    answer={
        "en": "A prefix hit ends at the first block that differs, and each block's hash chains "
        "every token before it. A timestamp or user id near the start makes the first block "
        "differ, so every block after it differs too, however long the identical text that "
        "follows. Put the stable part first and the per-request fields after it (at the end, "
        "or in the user turn): then the stable part spans whole blocks every request shares.",
        "zh": "前缀命中在第一个不同的块处结束，而每个块的哈希都链接了它之前的所有 token。"
        "开头附近的时间戳或用户 ID 让第一个块就不同，之后的每个块也都不同，"
        "无论后面相同的文字有多长。把稳定部分放在最前，把每个请求各自的字段放在它之后"
        "（末尾，或用户轮次里）：这样稳定部分会覆盖若干整块，被所有请求共享。",
    },
    lesson=_case_lesson(
        "timestamp-first",
        "🕒",
        {"en": "A timestamp early in the prompt", "zh": "提示词开头的时间戳"},
        scenario={
            "name": "case-timestamp-first",
            "description": "Three visitors; the rendered chat prompt starts with the time and "
            "the customer id, then the same instructions.",
            "model": "smollm2",
            "engine": {
                "block_size": 16,
                "num_gpu_blocks": 24,
                "max_num_seqs": 4,
                "max_num_batched_tokens": 128,
            },
            "requests": [
                {
                    "id": rid,
                    "prompt": _chat(f"Time: {t}. Customer: {u}.\n{_STABLE}", q),
                    "max_tokens": 3,
                    "arrival_step": step,
                    "ignore_eos": True,
                }
                for rid, t, u, q, step in _VISITS
            ],
        },
        intro={
            "en": "Each prompt is the chat template's text: a system turn that starts with "
            "the time and the customer id, then the shop's instructions, then the question.",
            "zh": "每个提示词都是对话模板渲染出的文本：系统轮次以时间和客户 ID 开头，"
            "接着是店铺的说明，然后是问题。",
        },
        moments=(
            Moment(
                "cache_miss",
                request="U2",
                text={
                    "en": "U2 misses although most of its system prompt is U1's word for word: "
                    "the time in the first block changed that block's hash, and the chain "
                    "carries the change to every block after it.",
                    "zh": "U2 的系统提示词大部分与 U1 一字不差，"
                    "却未命中：第一个块里的时间改变了它的哈希，"
                    "链又把这个变化带给了之后的每一个块。",
                },
            ),
        ),
        focus=("cache_miss", "cache_hit"),
    ),
    fix=Fix(
        label={
            "en": "Try the fix: stable part first, time and customer last",
            "zh": "试试修复：稳定部分在前，时间和客户在后",
        },
        explain={
            "en": "The system prompt holds only the instructions; the time and customer id "
            "move into the user turn, after everything every request shares.",
            "zh": "系统提示词只保留说明；时间和客户 ID 移到用户轮次中，"
            "排在所有请求共享的内容之后。",
        },
        requests=tuple(
            {
                "id": rid,
                "prompt": _chat(_STABLE, f"(time {t}, customer {u}) {q}"),
                "max_tokens": 3,
                "arrival_step": step,
                "ignore_eos": True,
            }
            for rid, t, u, q, step in _VISITS
        ),
        moments=(
            Moment(
                "cache_hit",
                request="U2",
                text={
                    "en": "U2 hits {num_tokens} tokens: the instructions come first now and "
                    "fill whole blocks that U1 cached.",
                    "zh": "U2 命中了 {num_tokens} 个 token："
                    "说明现在排在最前，填满了 U1 缓存的若干整块。",
                },
            ),
        ),
    ),
)


CASES: tuple[Case, ...] = (
    SHORT_PREFIX,
    SLIDING_CHURN,
    PREEMPTED_HITS,
    CACHE_SALT,
    USAGE_ZERO,
    TIMESTAMP_FIRST,
)
CASES_BY_ID: dict[str, Case] = {c.id: c for c in CASES}
