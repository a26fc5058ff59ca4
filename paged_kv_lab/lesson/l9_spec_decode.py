"""Lesson 9: speculative decoding with the n-gram proposer — drafts, their slots, and what gets
cached."""

from paged_kv_lab.lesson.catalog import Lesson, Moment, Question

LESSON = Lesson(
    id="specdec",
    number=9,
    icon="🔮",
    title={"en": "Speculative decoding and draft slots", "zh": "投机解码与草稿槽位"},
    summary={
        "en": "An n-gram proposer drafts tokens from the request's own "
        "text; one forward verifies them all. Drafts get KV slots, rejected "
        "ones are rolled back, and only real tokens are ever cached.",
        "zh": "n-gram 提议器从请求自己的文本里起草 token，一次前向全部验证。草稿占用 KV 槽位，"
        "被拒绝的草稿会回退，只有真实的 token 才会进入缓存。",
    },
    scenario={
        "name": "lesson-9-spec-decode",
        "description": "A: copying a list the prompt already holds (the proposer guesses well). "
        "B: free text (it guesses badly). Greedy, k = 4 drafts, n-grams of 2 to 4 tokens.",
        "model": "smollm2",
        "engine": {
            "block_size": 8,
            "num_gpu_blocks": 48,
            "max_num_seqs": 4,
            "max_num_batched_tokens": 128,
            "speculative": {
                "method": "ngram",
                "num_speculative_tokens": 4,
                "prompt_lookup_min": 2,
                "prompt_lookup_max": 4,
            },
        },
        "requests": [
            {
                "id": "A",
                "prompt": "Copy this list exactly, twice:\napple, banana, cherry, date, "
                "elderberry, fig, grape, kiwi, lemon, mango.\n\nCopy 1:\napple, banana,",
                "max_tokens": 32,
                "ignore_eos": True,
            },
            {
                "id": "B",
                "prompt": "Tell me a short story about a lighthouse keeper.",
                "max_tokens": 24,
                "arrival_step": 6,
                "ignore_eos": True,
            },
        ],
    },
    intro={
        "en": "Decoding makes one token per forward pass, and each pass reads every weight. "
        "**Speculative decoding** guesses several next tokens cheaply and lets one forward "
        "check them all. vLLM's **n-gram proposer** (prompt lookup) needs no second model: "
        "after each step it looks for the request's latest 2–4 tokens earlier in its own text "
        "and drafts the (up to 4) tokens that followed there. A copies a list its prompt "
        "already holds, so the guesses are good; B, arriving later, writes a story, where they "
        "are not. Watch the scheduled token counts, the block tables and the 🔮 👍 👎 events.",
        "zh": "解码每次前向只产生一个 token，而每次前向都要读一遍全部权重。"
        "**投机解码**廉价地猜出后面几个 token，再用一次前向把它们全部检验。vLLM 的 **n-gram "
        "提议器**（prompt lookup）不需要第二个模型：每一步之后，"
        "它在请求自己的文本里寻找最新的 2–4 个 token 之前出现的位置，把当时紧随其后的（最多 "
        "4 个）token 作为草稿。A 要复制提示词里已有的列表，所以猜得准；稍后到达的 B "
        "写一个故事，猜得就不准。请观察调度的 token 数、块表以及 🔮 👍 👎 事件。",
    },
    moments=(
        Moment(
            "draft_proposed",
            request="A",
            text={
                "en": "After A sampled, the proposer found its latest tokens earlier in its "
                "text and drafted {draft_token_ids}. Drafts live in `request.spec_token_ids`, "
                "**not** in its tokens: `num_tokens` is still {num_tokens}.",
                "zh": "A 采样之后，提议器在它的文本前面找到了最新几个 token，"
                "起草了 {draft_token_ids}。草稿存放在 `request.spec_token_ids` "
                "中，**不在**它的 token 里：`num_tokens` 仍是 {num_tokens}。",
            },
        ),
        Moment(
            "scheduled",
            request="A",
            where="with_drafts",
            text={
                "en": "A is scheduled **{num_tokens} tokens** from position {start}: "
                "its last sampled token plus the drafts (`num_tokens_with_spec − "
                "num_computed_tokens`). `allocate_slots` gives every one a KV slot from the "
                "pool, like any token. (Its `num_lookahead_tokens` stays 0 for the n-gram "
                "proposer: those reserve slots *past* the scheduled tokens, for drafters "
                "such as EAGLE or a draft model that write K/V there — lesson 11.) Caching "
                "stops at `min(computed + new, "
                "request.num_tokens)`: a block holding drafts is not hashed.",
                "zh": "A 从位置 {start} 起被调度了 **{num_tokens} 个 token**："
                "最后一个采样出的 token 加上草稿（`num_tokens_with_spec − num_computed_tokens`）。"
                "`allocate_slots` 像对待普通 token 一样，从块池里给每一个分配 KV 槽位。（对 "
                "n-gram 提议器，`num_lookahead_tokens` 保持为 0：它预留的是已调度 token "
                "*之后*的槽位，给 EAGLE 或草稿模型这类会在那里写 K/V 的起草器用——见第 11 课。）"
                "缓存只到 `min(computed + "
                "new, request.num_tokens)` 为止：装着草稿的块不会被计算哈希。",
            },
        ),
        Moment(
            "draft_accepted",
            request="A",
            text={
                "en": "One forward computed the model's greedy token after each "
                "position. It agreed with the drafts {accepted_token_ids} and "
                "added its own next token: A gained several tokens in one step, "
                "exactly the ones it would have generated one by one.",
                "zh": "一次前向计算出了模型在每个位置之后的贪心 token。"
                "它认可了草稿 {accepted_token_ids}，并接上了自己的下一个 token："
                "A 在一步里得到了好几个 token，而且正是逐个生成时会得到的那些。",
            },
        ),
        Moment(
            "draft_rejected",
            text={
                "en": "The model disagreed with {req}'s draft: the drafts "
                "{rejected_token_ids} are dropped and `num_computed_tokens` "
                "moves back to {num_computed_tokens}. Their K/V is already in "
                "the slots of positions {positions}, but nothing reads it: the "
                "next step writes the real tokens over it. Because caching stopped "
                "at `num_tokens`, no block ever got a hash of a rejected draft.",
                "zh": "模型不同意 {req} 的草稿：草稿 {rejected_token_ids} 被丢弃，"
                "`num_computed_tokens` 回退到 {num_computed_tokens}。它们的 K/V "
                "已经写进了位置 {positions} 的槽位，但没有人会读取：下一步会用真实的 token "
                "覆盖它们。由于缓存只到 `num_tokens` 为止，没有哪个块得到过被拒草稿的哈希。",
            },
        ),
        Moment(
            "draft_proposed",
            request="B",
            key=False,
            text={
                "en": "B's story rarely repeats itself, so drafts are "
                "rare — and when its latest tokens do match, the text "
                "that followed last time is usually not what comes next.",
                "zh": "B 的故事很少重复，所以草稿很少——即使最新的几个 token "
                "匹配上了，上次紧随其后的内容通常也不是接下来要写的。",
            },
        ),
        Moment(
            "cached",
            request="A",
            where="after_verify",
            text={
                "en": "Accepted drafts are real tokens now: `update_from_output` caches "
                "the blocks they filled, {blocks}, up to `num_computed_tokens`.",
                "zh": "被接受的草稿现在是真实的 token 了：`update_from_output` "
                "把它们填满的块 {blocks} 缓存起来，直到 `num_computed_tokens` 为止。",
            },
            key=False,
        ),
    ),
    outro={
        "en": "Greedy verification never changes the text: every token kept "
        "is the model's own argmax after exactly the tokens before it "
        "(tests check it against transformers' `generate`). What changes is "
        "the number of steps: count A's decode steps against its 32 tokens.",
        "zh": "贪心验证从不改变生成的文本：保留下来的每个 token 都是模型在其前面 "
        "token 之后的 argmax（测试拿它与 transformers 的 `generate` 对比）。"
        "改变的是步数：数一数 A 的解码步数，再与它的 32 个 token 比较。",
    },
    questions=(
        Question(
            prompt={
                "en": "A has 40 tokens, 39 computed, and 4 drafts; "
                "block_size 8. How many tokens are scheduled, and up to "
                "which token can blocks be cached when slots are allocated?",
                "zh": "A 有 40 个 token，已计算 39 个，另有 4 个草稿；block_size "
                "为 8。调度多少个 token？分配槽位时最多缓存到第几个 token？",
            },
            options=(
                {"en": "5 tokens; cached up to 40", "zh": "5 个 token；缓存到 40"},
                {"en": "5 tokens; cached up to 44", "zh": "5 个 token；缓存到 44"},
                {"en": "1 token; cached up to 40", "zh": "1 个 token；缓存到 40"},
            ),
            answer=0,
            explain={
                "en": "1 + 4 tokens get slots (positions 39–43), but caching stops at "
                "request.num_tokens = 40: the block of positions 40–47 holds only drafts.",
                "zh": "1 + 4 个 token 得到槽位（位置 39–43），但缓存止于 request.num_tokens = 40："
                "位置 40–47 的块里只有草稿。",
            },
        ),
        Question(
            prompt={
                "en": "3 of 4 drafts are accepted. What happens to num_computed_tokens?",
                "zh": "4 个草稿中有 3 个被接受。num_computed_tokens 会怎样？",
            },
            options=(
                {
                    "en": "It moves back by 1, the one rejected draft",
                    "zh": "回退 1，即那个被拒绝的草稿",
                },
                {"en": "It moves back by 4", "zh": "回退 4"},
                {
                    "en": "Nothing: rejected slots are freed instead",
                    "zh": "不变：被拒绝的槽位会被释放",
                },
            ),
            answer=0,
            explain={
                "en": "num_computed_tokens -= num_rejected. The slot stays in "
                "the block table and is simply written again by the next step.",
                "zh": "num_computed_tokens -= num_rejected。"
                "那个槽位留在块表里，下一步直接重新写入。",
            },
        ),
    ),
    focus=("draft_proposed", "draft_accepted", "draft_rejected"),
    panels=("myths",),  # open here: the delay_cache_blocks myth is about drafts and the cache
)
