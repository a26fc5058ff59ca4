"""The topic pages' words (EN + 中文): titles, the explanations around the live figures.

``{name}`` marks a figure the page fills in from what it measured (lessons/topics.py).
"""

TITLES = {
    "onehash": {"en": "One hash, two blocks", "zh": "一个哈希，两个块"},
    "blocksize": {"en": "Block size: 4, 16 or 64?", "zh": "块大小：4、16 还是 64？"},
    "collisions": {"en": "Hash collisions", "zh": "哈希碰撞"},
    "hitttft": {"en": "What a hit buys", "zh": "命中带来什么"},
    "designs": {"en": "Hash chains vs radix tree", "zh": "哈希链与基数树"},
}
ICONS = {"onehash": "👯", "blocksize": "📏", "collisions": "🎲", "hitttft": "⏱️", "designs": "🌳"}

BLOCK_SIZE = {
    "summary": {
        "en": "The same requests at block sizes 4, 16 and 64 on the loaded model: the empty "
        "slots of each last block, the block tables' length, and how coarse a hit becomes.",
        "zh": "同样的请求在加载的模型上分别以块大小 4、16、64 运行：每个最后一块里的空槽、"
        "块表的长度，以及命中变得多粗。",
    },
    "intro": {
        "en": "`block_size` counts **tokens**, not bytes. Two chat requests run below on "
        "{model}, once per block size: A finishes before B arrives, so B can hit A's cached "
        "blocks. Their prompts share {shared} tokens (SmolLM2's system prompt), and nothing "
        "more.",
        "zh": "`block_size` 数的是 **token**，不是字节。下面两个对话请求在 {model} 上"
        "按每种块大小各跑一次：A 完成后 B 才到达，所以 B 能命中 A 缓存的块。"
        "它们的提示词共有 {shared} 个相同的 token（SmolLM2 的系统提示词），仅此而已。",
    },
    "table": {
        "en": "Each request's block table at its longest: its length, and the slots of its "
        "last block that hold no token (they are paid for all the same).",
        "zh": "每个请求块表最长时的情况：块表长度，以及最后一块中没有存 token 的槽位"
        "（它们照样占内存）。",
    },
    "waste": {
        "en": "**Waste sits in the last block only.** Any free block serves any request, so "
        "paged KV has no fragmentation between blocks; what is lost is the unfilled end of "
        "each request's last block, up to block_size − 1 slots. Here A leaves {a} empty slots "
        "at the three sizes. So the claim that *bigger blocks fragment less* has it "
        "backwards: bigger blocks waste more, in the one place paging wastes anything.",
        "zh": "**浪费只在最后一块。** 任何空闲块都能给任何请求用，所以分页 KV 在块与块之间"
        "没有碎片；损失的只是每个请求最后一块没装满的部分，最多 block_size − 1 个槽位。"
        "这里 A 在三种块大小下分别空着 {a} 个槽位。所以“块越大碎片越少”的说法正好说反了："
        "块越大，在分页唯一会浪费的地方浪费得越多。",
    },
    "table_len": {
        "en": "**Shorter tables.** What bigger blocks buy: A's table has {lens} entries. "
        "Fewer entries to map, to hash and to look up, and longer runs of contiguous memory "
        "for the attention kernel.",
        "zh": "**更短的块表。** 大块带来的好处：A 的块表分别有 {lens} 项。需要映射、"
        "哈希和查找的项更少，注意力内核读到的连续内存也更长。",
    },
    "hits": {
        "en": "**Coarser hits.** Only full blocks are hashed, so B hits whole blocks of the "
        "{shared} shared tokens: {hits} tokens. Once a block is longer than the shared prefix, "
        "nothing hits at all.",
        "zh": "**更粗的命中。** 只有满块才有哈希，所以 B 只能按整块命中那 {shared} 个相同的 "
        "token：分别命中 {hits} 个。块一旦比共同前缀还长，就什么也命中不了。",
    },
    "bytes": {
        "en": "**How many bytes is a block?** Not a fixed 16 KB: one block holds K and V of "
        "block_size tokens in every layer, so its size follows the model. From this model's "
        "config ({layers} layers, {kv_heads} KV heads, head size {head_dim}, {dtype}):",
        "zh": "**一个块多少字节？** 不是固定的 16 KB：一个块存放 block_size 个 token 在每一层"
        "的 K 和 V，所以大小取决于模型。按这个模型的配置（{layers} 层、{kv_heads} 个 KV 头、"
        "头维度 {head_dim}、{dtype}）：",
    },
    "per_layer": {
        "en": "vLLM allocates the cache per layer, so one layer's page is the figure divided "
        "by {layers}: {pages}.",
        "zh": "vLLM 按层分配缓存，所以一层的页是上面的数除以 {layers}：{pages}。",
    },
}

COLLISIONS = {
    "summary": {
        "en": "A cached block is found by its hash alone. Why vLLM stores no token ids next to "
        "it, and nano-vllm does; the collision odds of a real run.",
        "zh": "缓存的块只凭哈希找到。为什么 vLLM 不在哈希旁存 token id，而 nano-vllm 存；"
        "以及一次真实运行的碰撞概率。",
    },
    "bet": {
        "en": "vLLM's prefix cache trusts the hash: `BlockHashToBlockMap` maps a hash to its "
        "block, and a `KVCacheBlock` keeps no token ids to check against. If two different "
        "prefixes ever had the same hash, a request would read the other prefix's K/V and "
        "answer wrongly, with no error. vLLM makes that practically impossible instead of "
        "checking for it: the hash is **sha256** (256 bits, the default "
        "`prefix_caching_hash_algo`) or **xxh3-128** (`xxhash`, 128 bits), and each block's "
        "hash takes its parent's hash as input, so equal hashes mean equal whole prefixes.",
        "zh": "vLLM 的前缀缓存信任哈希：`BlockHashToBlockMap` 把哈希映射到块，"
        "`KVCacheBlock` 里也没有可供核对的 token id。若两个不同的前缀哈希相同，请求就会读到"
        "另一个前缀的 K/V，悄无声息地答错。vLLM 的做法不是检查，而是让这几乎不可能发生："
        "哈希用 **sha256**（256 位，`prefix_caching_hash_algo` 的默认值）或 **xxh3-128**"
        "（`xxhash`，128 位），而且每个块的哈希都以父块的哈希为输入，"
        "所以哈希相同就意味着整个前缀相同。",
    },
    "nano": {
        "en": "**nano-vllm bets the other way.** Its block hash is xxh64 (64 bits), and its "
        "`Block` keeps `token_ids`: a lookup counts as a hit only if the tokens stored in the "
        "block equal the request's (`nanovllm/engine/block_manager.py`). At 64 bits, some "
        "200,000 blocks already give a one-in-a-billion chance of a collision, and a busy "
        "server hashes far more (table below); so it pays a token compare per block and the "
        "memory for the ids.",
        "zh": "**nano-vllm 押了相反的注。** 它的块哈希是 xxh64（64 位），它的 `Block` 保存 "
        "`token_ids`：只有块里存的 token 与请求的相同才算命中"
        "（`nanovllm/engine/block_manager.py`）。64 位时，大约 20 万个块就已有十亿分之一的"
        "碰撞概率，而繁忙的服务器要哈希的块远不止这些（见下表）；所以它每块多做一次 token "
        "比较，并为这些 id 付出内存。",
    },
    "seed": {
        "en": "**The seed.** Block 0's parent is NONE_HASH = hash(seed). vLLM takes the seed "
        "from `PYTHONHASHSEED` when it is set. Otherwise sha256 uses a fixed seed, so every "
        "instance computes the same hashes (KV events and connectors rely on that), and "
        "xxhash uses 32 random bytes per process: xxh3 is not collision resistant, so someone "
        "who knows the seed could craft two prompts with equal hashes, and a secret seed stops "
        "that. This app fixes the seed (`engine.hash_seed`) so that every run replays the "
        "same.",
        "zh": "**种子。** 第 0 块的父哈希是 NONE_HASH = hash(种子)。若设置了 "
        "`PYTHONHASHSEED`，vLLM 就用它作种子。否则 sha256 用固定种子，使所有实例算出相同的"
        "哈希（KV 事件和连接器依赖这一点）；xxhash 则每个进程用 32 个随机字节："
        "xxh3 不抗碰撞，知道种子的人可以构造出哈希相同的两个提示词，秘密种子能阻止这一点。"
        "本应用固定了种子（`engine.hash_seed`），好让每次运行都能完全重现。",
    },
    "live": {
        "en": "**This run:** lesson 2's scenario on {model} with `hash_algo` = {algo}: "
        "{blocks} blocks were cached, under {distinct} distinct hashes of {bits} bits. "
        "Seed {seed}, NONE_HASH {none_hash}.",
        "zh": "**这次运行：** 第 2 课的场景，在 {model} 上，`hash_algo` = {algo}："
        "缓存了 {blocks} 个块，共 {distinct} 个不同的 {bits} 位哈希。"
        "种子 {seed}，NONE_HASH {none_hash}。",
    },
    "twins": {
        "en": "{blocks} cached blocks but {distinct} hashes: where a hash is held by several "
        "blocks, two requests computed the same content (see *One hash, two blocks*).",
        "zh": "缓存了 {blocks} 个块，却只有 {distinct} 个哈希：一个哈希对应多个块的地方，"
        "是两个请求算出了相同的内容（见*一个哈希，两个块*）。",
    },
    "odds": {
        "en": "The birthday bound: among n distinct hashes of b bits, the chance that some two "
        "are equal is 1 − exp(−n(n−1) / 2^(b+1)). For this run's n = {distinct}:",
        "zh": "生日界：n 个 b 位的不同哈希中，有两个相等的概率为 1 − exp(−n(n−1) / 2^(b+1))。"
        "本次运行 n = {distinct}：",
    },
}

TTFT = {
    "summary": {
        "en": "Time to first token of one prompt on the loaded model, without a prefix hit and "
        "with one, measured now.",
        "zh": "在加载的模型上测一个提示词的首 token 时间：没有前缀命中与有命中，现场测量。",
    },
    "intro": {
        "en": "A prefix hit skips the prefill of the hit tokens: their K/V is already in the "
        "blocks, so they are not run through the model again. Time to first token (TTFT) is "
        "mostly that prefill. One prompt of {tokens} tokens runs twice in the same engine on "
        "{model} ({device}), block_size {block_size}: first on an empty cache, then again, "
        "when its full blocks hit ({hit} tokens, so only {computed} are computed). Each is "
        "timed from its first step to the step that returns its first token; of {rounds} "
        "rounds, the fastest of each is shown.",
        "zh": "前缀命中会跳过命中 token 的预填充：它们的 K/V 已经在块里，不必再过一遍模型。"
        "首 token 时间（TTFT）主要就是这段预填充。一个 {tokens} 个 token 的提示词在 {model}"
        "（{device}）上、block_size {block_size} 的同一个引擎里跑两次：第一次缓存为空，"
        "第二次它的满块全部命中（{hit} 个 token，只需计算 {computed} 个）。"
        "每次从它的第一步计时到返回第一个 token 的那一步；共 {rounds} 轮，各取最快的一次。",
    },
    "note": {
        "en": "Measured on this machine just now; other work on it slows some rounds, which "
        "is why the fastest round counts. What a hit saves grows with the model: it skips "
        "the prefill's compute, while a step's fixed costs (scheduling, recording, sampling) "
        "stay, so a tiny model gains little and a real one much. Every decode step after the "
        "first token costs the same, and the hit blocks still occupy the cache.",
        "zh": "刚刚在这台机器上测得；机器上的其他工作会拖慢某些轮次，所以取最快的一轮。"
        "命中省下多少随模型而变：它跳过的是预填充的计算，而每一步的固定开销（调度、记录、"
        "采样）还在，所以微型模型几乎不受益，真实模型受益很大。第一个 token 之后的每一步"
        "解码照样花时间，命中的块也照样占着缓存。",
    },
}
