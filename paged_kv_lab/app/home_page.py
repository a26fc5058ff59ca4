"""The home page: paged KV caching in a minute, one live picture, the lesson list."""

from __future__ import annotations

import streamlit as st

from paged_kv_lab.app.lesson_page import current_lang, render_lesson
from paged_kv_lab.lesson import LESSONS, PAGE_FILES
from paged_kv_lab.text.i18n import tr

# A backslash that ends a line joins it to the next (Python drops both): the text stays as
# written, one source line per line of the page's markdown.
MINUTE = {
    "en": """
**The problem.** To generate token *n + 1*, a transformer needs the keys and values (K/V) of all \
*n* tokens
before it. Recomputing them every step is wasteful, so they are cached — one K and one V vector \
per token,
per layer. Reserving one contiguous buffer per request for its *maximum* length wastes most of the \
memory
and fragments it.

**The idea (PagedAttention, vLLM).** Cut the cache into fixed-size **blocks** of `block_size` \
tokens, like
pages of virtual memory. A request owns a **block table**: logical block *i* → some physical block \
anywhere in
the pool. Token *p* lives in logical block *p // block_size* at offset *p % block_size*. Blocks \
are handed out
from a **free queue** as the request grows, and returned when it finishes.

**The bonus (prefix caching).** A full block is named by a chained hash of its tokens and \
everything before
them. A new request whose prompt starts the same way finds those hashes and **shares** the blocks
(ref_cnt > 1) instead of recomputing them. Freed blocks keep their hash in the queue until they \
are reused —
the cache is simply the free queue's memory.

Below, the **real** model runs two requests with the same first words. Press *Step*.
""",
    "zh": """
**问题。** 要生成第 *n + 1* 个 token，Transformer 需要前面全部 *n* 个 token 的键和值（K/V）。\
每步都重算太浪费，
所以要缓存——每个 token、每一层各一个 K 向量和一个 V 向量。如果按*最大*长度给每个请求预留一段连续缓\
冲区，
大部分显存会被浪费，而且产生碎片。

**思路（PagedAttention，vLLM）。** 把缓存切成固定大小的**块**，每块 `block_size` 个 token，\
就像虚拟内存的页。
每个请求有一张**块表**：逻辑块 *i* → 池中任意位置的某个物理块。第 *p* 个 token 位于逻辑块 *p // \
block_size* 的
偏移 *p % block_size* 处。请求增长时从**空闲队列**取块，结束时归还。

**额外收益（前缀缓存）。** 每个满块用一个链式哈希命名，哈希覆盖它的 token 以及之前的全部内容。\
新请求的提示词
开头相同时，会找到这些哈希并**共享**这些块（ref_cnt > 1），而不用重算。被释放的块在队列里保留哈希，\
直到被复用——
缓存就是空闲队列的记忆。

下面，**真实**模型运行两个开头相同的请求。请按*单步*。
""",
}


def render_home() -> None:
    lang = current_lang()
    st.title(f"🧱 {tr('app_title', lang)}")
    st.header(tr("home_title", lang))
    st.markdown(MINUTE[lang])
    st.subheader(tr("home_live", lang))
    render_lesson("home", compact=True)
    st.subheader(tr("home_lessons", lang))
    cols = st.columns(2)
    for i, lesson in enumerate(LESSONS):
        with cols[i % 2].container(border=True):
            st.page_link(
                PAGE_FILES[lesson.id],
                label=f"{lesson.number}. {tr(lesson.title, lang)}",
                icon=lesson.icon,
            )
            st.caption(tr(lesson.summary, lang))
