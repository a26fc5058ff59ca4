"""Lesson 11: a draft model that writes K/V ahead — the lookahead slots vLLM reserves for it
(``num_lookahead_tokens``), a block allocated only for them, and what happens to them."""

from paged_kv_lab.lesson.catalog import Lesson, Moment, Question, Toggle

LESSON = Lesson(
    id="draftmodel",
    number=11,
    icon="🪜",
    title={"en": "Lookahead slots: a draft model", "zh": "前瞻槽位：草稿模型"},
    summary={
        "en": "A draft model (SmolLM2's own first layers) proposes tokens and writes their K/V "
        "past the verified tokens, so every step the scheduler reserves k lookahead slots — "
        "sometimes a whole block no token lands in. Rejected drafts roll back; the slots stay.",
        "zh": "草稿模型（SmolLM2 自己的前几层）提出 token，并把它们的 K/V 写在已验证 token "
        "之后，所以调度器每一步都预留 k 个前瞻槽位——有时是一整块没有任何 token 落入的块。"
        "被拒绝的草稿会回退，槽位留下。",
    },
    scenario={
        "name": "lesson-11-draft-model",
        "description": "A copies a list its prompt holds; B writes free text and shares A's "
        "first words. Greedy, k = 3 drafts from a draft model that is the target's own first "
        "layers (three quarters of them) with its final norm and LM head.",
        "model": "smollm2",
        "engine": {
            "block_size": 4,
            "num_gpu_blocks": 48,
            "max_num_seqs": 4,
            "max_num_batched_tokens": 128,
            "speculative": {
                "method": "draft_model",
                "num_speculative_tokens": 3,
                "num_draft_layers": None,
                "prompt_lookup_min": 2,
                "prompt_lookup_max": 4,
            },
        },
        "requests": [
            {
                "id": "A",
                "prompt": "Copy this list exactly, twice:\napple, banana, cherry, date, "
                "elderberry, fig, grape.\n\nCopy 1:\napple, banana,",
                "max_tokens": 20,
                "ignore_eos": True,
            },
            {
                "id": "B",
                "prompt": "Copy this list exactly, twice: tell me a short story instead.",
                "max_tokens": 12,
                "arrival_step": 4,
                "ignore_eos": True,
            },
        ],
    },
    intro={
        "en": "Lesson 9's n-gram proposer writes no K/V: its drafts get slots as scheduled "
        "tokens, and `num_lookahead_tokens` stays 0. A **draft model** is different. Here it "
        "is the target cut short — SmolLM2's first layers, then its final norm and LM head "
        "(self-speculative, early exit) — with **K/V pools of its own**, reached through the "
        "*same* block tables. After each target forward it reads the verified tokens, then "
        "feeds its own drafts one by one, writing their K/V up to k − 1 positions past the "
        "request's tokens. Those slots must exist before it runs, so vLLM sets "
        "`num_lookahead_tokens = num_speculative_tokens` and the scheduler calls "
        "`allocate_slots(request, num_new_tokens, num_lookahead_tokens=k)`. In the grid, a "
        "hollow slot is allocated but holds no token yet. Use the switch to compare with the "
        "n-gram proposer.",
        "zh": "第 9 课的 n-gram 提议器不写 K/V：它的草稿作为已调度 token 得到槽位，"
        "`num_lookahead_tokens` 保持为 0。**草稿模型**不同。这里的草稿模型是截短的目标模型——"
        "SmolLM2 的前几层，接上它的最终归一化层和 LM head（自投机、提前退出）——它有**自己的 "
        "K/V 池**，通过*同一张*块表寻址。每次目标模型前向之后，它先读入已验证的 token，"
        "再逐个喂入自己的草稿，把它们的 K/V 写到请求 token 之后最多 k − 1 个位置。"
        "这些槽位必须在它运行前就存在，所以 vLLM 令 `num_lookahead_tokens = "
        "num_speculative_tokens`，调度器调用 `allocate_slots(request, num_new_tokens, "
        "num_lookahead_tokens=k)`。网格里空心的槽位表示已分配、但还没有 token。"
        "用开关与 n-gram 提议器对比。",
    },
    moments=(
        Moment(
            "scheduled",
            request="A",
            where="with_drafts",
            text={
                "en": "A is scheduled **{num_tokens} tokens** from position {start}: its last "
                "token and the drafts. `allocate_slots` gave it slots up to position "
                "{start} + {num_tokens} + k − 1: **k lookahead slots past the scheduled "
                "ones**, where the draft model will write this step (hollow in the grid).",
                "zh": "A 从位置 {start} 起被调度了 **{num_tokens} 个 token**：最后一个 token "
                "加上草稿。`allocate_slots` 给它的槽位一直到位置 {start} + {num_tokens} + k − 1："
                "**在已调度槽位之后再多 k 个前瞻槽位**，草稿模型这一步会写在那里（网格里空心的）。",
            },
        ),
        Moment(
            "allocated",
            where="lookahead_only",
            text={
                "en": "Block {blocks} was allocated for {req} although **no scheduled token "
                "lands in it**: the lookahead slots crossed a block boundary, so a whole block "
                "is taken from the free queue only for the draft's K/V. It belongs to {req}'s "
                "block table like any other, but holds no token (all its slots hollow).",
                "zh": "块 {blocks} 被分配给了 {req}，尽管**没有任何已调度的 token 落在里面**："
                "前瞻槽位跨过了块边界，于是为了草稿的 K/V 从空闲队列里取出了一整块。"
                "它和其他块一样在 {req} 的块表里，但不含任何 token（所有槽位都是空心的）。",
            },
        ),
        Moment(
            "draft_proposed",
            request="A",
            text={
                "en": "The draft model proposed {draft_token_ids}. First pass: the tokens the "
                "target verified plus the token it just sampled (their draft K/V written at "
                "the same slots as the target's); then one pass per draft, each writing one "
                "position further into the lookahead slots. The last draft is proposed, never "
                "fed. `num_tokens` is still {num_tokens}: drafts are not tokens.",
                "zh": "草稿模型提出了 {draft_token_ids}。第一遍：目标模型已验证的 token "
                "加上它刚采样的 token（它们的草稿 K/V 写在与目标模型相同的槽位）；"
                "然后每个草稿一遍，每遍往前瞻槽位里多写一个位置。"
                "最后一个草稿只被提出，从不被喂入。`num_tokens` 仍是 "
                "{num_tokens}：草稿不是 token。",
            },
        ),
        Moment(
            "draft_accepted",
            text={
                "en": "One target forward agreed with {req}'s drafts {accepted_token_ids} and "
                "added its own next token: several tokens for one forward of the whole "
                "model, exactly the ones greedy decoding makes one by one.",
                "zh": "一次目标模型前向认可了 {req} 的草稿 {accepted_token_ids}，"
                "并接上了自己的下一个 token：整个模型前向一次得到好几个 token，"
                "正是贪心解码逐个生成的那些。",
            },
        ),
        Moment(
            "draft_rejected",
            text={
                "en": "The target disagreed: {req}'s drafts {rejected_token_ids} are dropped and "
                "`num_computed_tokens` **rolls back to {num_computed_tokens}**. The slots of "
                "positions {positions} — and any lookahead block — **stay allocated** to {req}: "
                "nothing is freed. Their stale K/V is never read, and the next steps write "
                "over it.",
                "zh": "目标模型不同意：{req} 的草稿 {rejected_token_ids} 被丢弃，"
                "`num_computed_tokens` **回退到 {num_computed_tokens}**。位置 {positions} 的槽位"
                "——以及前瞻块——**仍然分配给** {req}：什么都不释放。其中过时的 K/V 不会被读取，"
                "接下来的步骤会覆盖它。",
            },
        ),
        Moment(
            "cached",
            where="after_verify",
            text={
                "en": "Accepted drafts are tokens now, so the blocks they filled, {blocks}, are "
                "cached — up to `request.num_tokens` and no further. A lookahead slot never "
                "holds a token, so it never enters the prefix cache.",
                "zh": "被接受的草稿现在是 token 了，所以它们填满的块 {blocks} 被缓存——只到 "
                "`request.num_tokens` 为止。前瞻槽位从不含 token，所以从不进入前缀缓存。",
            },
        ),
        Moment(
            "cache_hit",
            request="B",
            key=False,
            text={
                "en": "B starts with A's words, so it hits A's cached blocks. The draft model's "
                "K/V for them came along: it lives at the same block ids, in the draft's own "
                "pools, written when A computed those blocks.",
                "zh": "B 以 A 的开头开始，所以命中了 A 的缓存块。草稿模型对应的 K/V 也一起复用了："
                "它在草稿自己的池里、同样的块号上，是 A 计算这些块时写下的。",
            },
        ),
        Moment(
            "finished",
            request="A",
            text={
                "en": "Measured so far: {spec_verified} drafts verified, {spec_accepted} "
                "accepted — an acceptance rate of **{acceptance_rate}** — and "
                "**{tokens_per_forward} tokens per target forward** per request (1 without "
                "speculation). Early exit from three quarters of the layers guesses right "
                "only part of the time; switch to n-gram to compare.",
                "zh": "目前测得：验证了 {spec_verified} 个草稿，接受 {spec_accepted} 个——接受率 "
                "**{acceptance_rate}**——每个请求**每次目标前向得到 {tokens_per_forward} 个 "
                "token**（不投机时为 1）。从四分之三的层提前退出，只能部分猜对；"
                "切换到 n-gram 比较一下。",
            },
        ),
    ),
    outro={
        "en": "Greedy verification never changes the text (tests compare every request with "
        "transformers' `generate`, with prefix hits and after preemption). What the draft "
        "model costs in KV memory is its own pools, and k slots reserved per running request.",
        "zh": "贪心验证从不改变生成的文本（测试把每个请求与 transformers 的 `generate` "
        "对比，包括前缀命中和抢占之后）。草稿模型在 KV 内存上的代价，是它自己的 K/V 池，"
        "以及每个运行中的请求预留的 k 个槽位。",
    },
    questions=(
        Question(
            prompt={
                "en": "k = 4, block_size 8. A request has 17 tokens, 16 computed, and 4 drafts. "
                "How many blocks does it hold after allocate_slots(num_new_tokens=5, "
                "num_lookahead_tokens=4)?",
                "zh": "k = 4，block_size 为 8。一个请求有 17 个 token，已计算 16 个，"
                "另有 4 个草稿。allocate_slots(num_new_tokens=5, num_lookahead_tokens=4) "
                "之后它持有几个块？",
            },
            options=(
                {
                    "en": "4: slots for 16 + 5 + 4 = 25 tokens; the 4th block only for lookahead",
                    "zh": "4 个：16 + 5 + 4 = 25 个 token 的槽位；第 4 块只为前瞻",
                },
                {
                    "en": "3: slots for 16 + 5 = 21 tokens",
                    "zh": "3 个：16 + 5 = 21 个 token 的槽位",
                },
                {"en": "5: one extra block per draft pass", "zh": "5 个：每遍草稿多一个块"},
            ),
            answer=0,
            explain={
                "en": "num_tokens_need_slot = computed + new + lookahead = 25 → cdiv(25, 8) = 4. "
                "Position 24, in block 3, is a lookahead slot: no scheduled token lands there.",
                "zh": "num_tokens_need_slot = 已计算 + 新 + 前瞻 = 25 → cdiv(25, 8) = 4。"
                "位置 24 在第 3 块里，是前瞻槽位：没有已调度的 token 落在那里。",
            },
        ),
        Question(
            prompt={
                "en": "Every draft is rejected. What happens to the block allocated only for "
                "lookahead?",
                "zh": "所有草稿都被拒绝。只为前瞻分配的那个块会怎样？",
            },
            options=(
                {
                    "en": "It stays in the request's block table; later steps overwrite it",
                    "zh": "它留在请求的块表里；之后的步骤覆盖它",
                },
                {"en": "It is freed at once", "zh": "立刻被释放"},
                {
                    "en": "It is cached, so another request can reuse the drafts",
                    "zh": "它被缓存，别的请求可以复用这些草稿",
                },
            ),
            answer=0,
            explain={
                "en": "Only num_computed_tokens rolls back. Blocks are freed when a request "
                "finishes or is preempted, and caching stops at request.num_tokens.",
                "zh": "只有 num_computed_tokens 回退。块只在请求结束或被抢占时释放，"
                "而缓存止于 request.num_tokens。",
            },
        ),
        Question(
            prompt={
                "en": "Why is num_lookahead_tokens k for the draft model but 0 for the n-gram "
                "proposer?",
                "zh": "为什么草稿模型的 num_lookahead_tokens 是 k，而 n-gram 提议器是 0？",
            },
            options=(
                {
                    "en": "The draft model writes K/V past the target's scheduled positions",
                    "zh": "草稿模型会把 K/V 写到目标模型已调度位置之后",
                },
                {
                    "en": "The n-gram drafts are always accepted",
                    "zh": "n-gram 的草稿总会被接受",
                },
                {
                    "en": "The draft model needs bigger blocks",
                    "zh": "草稿模型需要更大的块",
                },
            ),
            answer=0,
            explain={
                "en": "Both verify drafts as scheduled tokens. Only a drafter with a forward of "
                "its own (draft model, EAGLE) writes K/V ahead of them, in this same step.",
                "zh": "两者都把草稿当作已调度 token 来验证。"
                "只有自己做前向的起草器（草稿模型、EAGLE）才会在同一步里把 K/V 写到它们之后。",
            },
        ),
    ),
    toggles=(
        Toggle(
            "spec_method",
            {"en": "Drafter", "zh": "起草器"},
            ("draft_model", "ngram"),
            (
                {"en": "draft model (lookahead k)", "zh": "草稿模型（前瞻 k）"},
                {"en": "n-gram (lookahead 0)", "zh": "n-gram（前瞻 0）"},
            ),
        ),
    ),
    focus=("draft_proposed", "draft_accepted", "draft_rejected", "allocated"),
)
