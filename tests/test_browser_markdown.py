"""A real browser (Debian's chromium) walks every page of the app, as its sidebar lists them, and a
lesson's static export step by step: no Markdown mark (``**`` or a backtick) may reach the visible
text, in the page or inside the player (its shadow root, any frame). Text that comes from tokens
(generated text, a block's tokens, the quoted tokens of an event) is the model's, not ours, and is
left out. The player's Markdown renderer (text.js md) is also run on its own, on hostile input."""

import re

import pytest

from tests.test_browser import (  # noqa: F401  (pytest fixtures)
    ROOT,
    browser,
    open_player,
    server,
    wait_idle,
    wait_step,
)

pytestmark = pytest.mark.browser

# The visible text nodes of a document, its shadow roots and their shadow roots, minus the text
# that shows tokens or code verbatim (the player's token texts, its tooltip, code blocks, fields).
VISIBLE_TEXT = """() => {
  const SKIP = 'pre, textarea, input, .pkv-text, .pkv-tip, [data-testid="stCode"], .stCode';
  const texts = [];
  const walk = (root) => {
    const w = document.createTreeWalker(root, NodeFilter.SHOW_TEXT | NodeFilter.SHOW_ELEMENT);
    for (let n = w.currentNode; n; n = w.nextNode()) {
      if (n.nodeType === Node.ELEMENT_NODE) { if (n.shadowRoot) walk(n.shadowRoot); continue; }
      const p = n.parentElement;
      if (!p || !n.data.trim() || p.closest(SKIP)) continue;
      const seen = { checkOpacity: true, checkVisibilityCSS: true };
      if (p.checkVisibility && !p.checkVisibility(seen)) continue;
      // an event's sentence and the address line quote the tokens they name: “…” (the model's)
      const quotes = p.closest(".pkv-events, .pkv-addr-line");
      texts.push(quotes ? n.data.replace(/“[^”]*”/g, "“…”") : n.data);
    }
  };
  walk(document.body || document.documentElement);
  return texts.join("\\n");
}"""

MARK = re.compile(r".{0,40}(\*\*|`).{0,40}")


def marks(page) -> list[str]:
    """Markdown marks in the visible text of the page and of every frame in it."""
    found = []
    for frame in page.frames:
        try:
            text = frame.evaluate(VISIBLE_TEXT)
        except Exception:  # a frame that went away while the page reran
            continue
        found += [m.group(0) for m in MARK.finditer(text)]
    return found


def settle(page, limit_s: float = 90.0):
    """Until the page is drawn: Streamlit idle, and its text the same on two looks 0.4 s apart (a
    page's player and panels arrive after its first paint). Bounded."""
    text = None
    for _ in range(int(limit_s / 0.4)):
        wait_idle(page)
        now = page.evaluate(VISIBLE_TEXT)
        if now == text:
            return
        text = now
        page.wait_for_timeout(400)


def go(page, url: str) -> None:
    """To another page of the app as a learner does, by its sidebar link (no reload)."""
    path = "/" + url.split("/", 3)[3].split("?")[0]
    page.locator(f'[data-testid=stSidebarNav] a[href="{url}"]').click()
    page.wait_for_function("(p) => location.pathname === p", arg=path.rstrip("/") or "/")


def test_no_markdown_mark_shows_on_any_page_or_in_an_export(server, browser, tmp_path):  # noqa: F811
    """Each page as it opens (a lesson's player at step 0: the intro), then lesson 1's export at
    every step (its moments and outro); the other lessons' moments: test_every_lesson_text_..."""
    page = browser.new_page(viewport={"width": 1400, "height": 1800}, accept_downloads=True)
    page.goto(server)
    page.wait_for_selector("[data-testid=stSidebarNav] a", timeout=90_000)
    links = page.locator("[data-testid=stSidebarNav] a").evaluate_all("els => els.map(a => a.href)")
    assert len(links) >= 12, links  # home, nine lessons, the trace viewer, live vLLM
    shown = {}
    for url in dict.fromkeys(links):
        go(page, url)
        settle(page)
        if page.locator(".pkv").count():
            page.wait_for_selector(".pkv[data-total]", timeout=60_000)
        shown[url] = marks(page)
        if url.rstrip("/").endswith("/eviction"):  # its myths are open: seed 003's three there too
            text = page.evaluate(VISIBLE_TEXT)
            for claim in ("evict_blocks(block_ids)", "delay_cache_blocks means", "ext_comp:"):
                assert claim in text, f"the {claim} myth is on the eviction page"
        if url.rstrip("/").endswith("/trace_viewer"):  # its player: the example trace
            page.get_by_role("button", name="Load an example trace").click()
            page.wait_for_selector(".pkv[data-total]", timeout=90_000)
            settle(page)
            shown[url] += marks(page)
    bad = {u: m for u, m in shown.items() if m}
    assert not bad, f"Markdown marks shown as text: {bad}"

    # the export of lesson 1 (its intro and moments are the most marked up), every step of it
    open_player(page, server + "/blocks")
    with page.expect_download(timeout=60_000) as dl:
        page.get_by_role("button", name="Download this run").click()
    path = tmp_path / "lesson1.html"
    dl.value.save_as(path)
    page.close()
    page = browser.new_context(offline=True).new_page()
    open_player(page, path.as_uri())
    n = int(page.locator(".pkv").get_attribute("data-total"))
    narration = page.locator('[data-role="narration"]')
    assert narration.locator("strong").count() >= 1, "the intro's bold is drawn as bold"
    bad = {}
    for k in range(n + 1):
        wait_step(page, k)
        found = marks(page)
        if found:
            bad[k] = found
        page.keyboard.press("ArrowRight")
    assert not bad, f"Markdown marks shown as text in the export, by step: {bad}"
    page.context.close()


MD_CASES = [
    (
        "The **blocks** and `get_new_blocks`",
        "The <strong>blocks</strong> and <code>get_new_blocks</code>",
    ),
    ("从**队头**取出，*first*", "从<strong>队头</strong>取出，<em>first</em>"),
    ("**`touch`** it", "<strong><code>touch</code></strong> it"),
    (r"req **0\_A\*\*\`x\`** ok", "req <strong>0_A**`x`</strong> ok"),
    ("2 * 3 * 4 and a ** b", "2 * 3 * 4 and a ** b"),
    ("unclosed `tick and **bold", "unclosed `tick and **bold"),
    (
        "<img src=x onerror=alert(1)> **<b>x</b>**",
        "&lt;img src=x onerror=alert(1)&gt; <strong>&lt;b&gt;x&lt;/b&gt;</strong>",
    ),
    (
        "[issue](https://github.com/vllm-project/vllm/issues/9660) [x](javascript:alert(1))",
        '<a href="https://github.com/vllm-project/vllm/issues/9660" target="_blank" '
        'rel="noopener noreferrer">issue</a> [x](javascript:alert(1))',
    ),
]


def test_the_players_markdown_is_nodes_never_html(browser):  # noqa: F811
    """text.js md() on its own: what it draws, and that no input becomes an element it did not
    build (a tag, a script, a javascript: link)."""
    text_js = (ROOT / "paged_kv_lab" / "player" / "assets" / "text.js").read_text(encoding="utf-8")
    page = browser.new_page()
    dialogs = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.set_content("<!doctype html><body></body>")
    page.add_script_tag(
        content=text_js.replace("export function", "function")
        + "\nwindow.__md = (s) => { const d = document.createElement('div');"
        " d.append(...md(s)); return d.innerHTML; };",
        type="module",
    )
    page.wait_for_function("() => typeof window.__md === 'function'")
    for source, html in MD_CASES:
        assert page.evaluate("(s) => window.__md(s)", source) == html, source
    page.wait_for_timeout(100)
    assert not dialogs
    page.close()


def lesson_texts() -> dict[str, str]:
    """Every text the player draws as Markdown: each lesson's intro, moments and outro (every
    Lesson in the lessons package, in both languages) and the player's captions."""
    import importlib
    import pkgutil

    import paged_kv_lab.lesson as lessons
    from paged_kv_lab.lesson.catalog import Lesson
    from paged_kv_lab.text.i18n import player_strings

    found = {}
    for mod in pkgutil.iter_modules(lessons.__path__):
        m = importlib.import_module(f"{lessons.__name__}.{mod.name}")
        for value in vars(m).values():
            for lesson in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(lesson, Lesson):
                    found[lesson.id] = lesson
    out = {}
    for lesson in found.values():
        texts = [("intro", lesson.intro), ("outro", lesson.outro)]
        texts += [(f"moment {i}", m.text) for i, m in enumerate(lesson.moments)]
        for name, text in texts:
            for lang, t in (text or {}).items():
                out[f"{lesson.id} {name} {lang}"] = t
    for lang in ("en", "zh"):
        for name, t in player_strings(lang).items():
            if name.endswith("caption"):
                out[f"player.{name} {lang}"] = t
    return out


def test_every_lesson_text_draws_without_a_mark(browser):  # noqa: F811
    """Each lesson's narration through the player's renderer: no ``**`` or backtick is left in
    the text it draws (a pair that does not close, a mark the renderer does not know)."""
    texts = lesson_texts()
    assert len(texts) > 100
    text_js = (ROOT / "paged_kv_lab" / "player" / "assets" / "text.js").read_text(encoding="utf-8")
    page = browser.new_page()
    page.set_content("<!doctype html><body></body>")
    page.add_script_tag(
        content=text_js.replace("export function", "function")
        + "\nwindow.__drawn = (s) => { const d = document.createElement('div');"
        " d.append(...md(s)); return d.textContent; };",
        type="module",
    )
    page.wait_for_function("() => typeof window.__drawn === 'function'")
    drawn = page.evaluate(
        "(all) => Object.fromEntries(Object.entries(all).map(([k, s]) => [k, window.__drawn(s)]))",
        texts,
    )
    page.close()
    bad = {k: v for k, v in drawn.items() if "**" in v or "`" in v}
    assert not bad, bad
