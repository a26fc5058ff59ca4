"""No Markdown mark (``**`` or a backtick) may reach the visible text, in a page or inside the
player (its shadow root, any frame). Text that comes from tokens (generated text, a block's tokens,
the quoted tokens of an event) is the model's, not ours, and is left out. Here: the player's
Markdown renderer (text.js md) on its own, on hostile input and on every lesson text. The walk of
every page and of a lesson's static export is test_browser_pages_open's (its server has every run
recorded already by its warm-up, so the walk records none again)."""

import pytest

from support.paths import ROOT

pytestmark = pytest.mark.browser

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
    """Every text the player draws as Markdown: each lesson's and casebook case's intro, moments
    and outro (lesson/lessons/*.yaml, lesson/cases/*.yaml, in both languages) and the player's
    captions."""
    from paged_kv_lab.content import BY_ID
    from paged_kv_lab.content.casebook import CASES
    from paged_kv_lab.text.i18n import player_strings, tr

    played = list(BY_ID.values())
    played += [lesson for c in CASES for lesson in (c.lesson, c.fixed_lesson()) if lesson]
    out = {}
    for lesson in played:
        texts = [("intro", lesson.intro), ("outro", lesson.outro)]
        texts += [(f"moment {i}", m.text) for i, m in enumerate(lesson.moments)]
        for name, key in texts:
            for lang in ("en", "zh"):
                if key is not None:
                    out[f"{lesson.id} {name} {lang}"] = tr(key, lang)
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
