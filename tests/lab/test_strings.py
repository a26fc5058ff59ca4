"""The one catalogue of UI strings (text/catalogue/): every entry in both languages with the
same fields, every key the Python code and the player's JavaScript use is there, every entry is
used, and the player's templates are filled with the fields they name."""

import json
import re
import string

import pytest

from paged_kv_lab.content import BY_ID
from paged_kv_lab.content.casebook import CASES
from paged_kv_lab.text.i18n import (
    LANGS,
    PLAYER_PREFIX,
    Text,
    catalogue,
    catalogue_files,
    player_strings,
    tr,
)
from support.paths import ROOT

PY_DIRS = tuple(
    f"paged_kv_lab/{d}"
    for d in (
        "app",
        "lesson",
        "text",
        "why",
        "player",
        "runs",
        "cli",
        "record",
        "watch",
        "workload",
    )
)
ASSETS = ROOT / "paged_kv_lab" / "player" / "assets"


def fields(text: str) -> set[str]:
    return {
        name.split(".")[0].split("[")[0] for _, name, _, _ in string.Formatter().parse(text) if name
    }


def texts(entry) -> list[str]:
    return list(entry) if isinstance(entry, tuple) else [entry]


def python_sources() -> str:
    return "\n".join(
        p.read_text(encoding="utf-8") for d in PY_DIRS for p in sorted((ROOT / d).rglob("*.py"))
    )


def js_sources() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in sorted(ASSETS.glob("*.js")))


def python_keys() -> tuple[set[str], set[str]]:
    """Keys passed to tr() or Text() as a literal, and the literal starts of the keys built from
    an f-string."""
    src = python_sources()
    call = r"\b(?:tr|Text)\(\s*"
    literal = set(re.findall(call + r"""(["'])([^"'{}]+)\1(?!\s*\+)""", src))
    prefixes = set(re.findall(call + r"""f(["'])([^"'{]*)\{""", src)) | set(
        re.findall(call + r"""(["'])([^"']+)\1\s*\+""", src)
    )
    return {k for _, k in literal}, {p for _, p in prefixes}


def player_names() -> tuple[set[str], set[str]]:
    """The player's words its JavaScript and HTML read (L.<name>, data-label, data-act buttons),
    and the literal starts of those it builds (L[`kind_${k}`])."""
    js, html = js_sources(), (ASSETS / "player.html").read_text(encoding="utf-8")
    names = set(re.findall(r"\bL\.(\w+)", js)) | set(re.findall(r'data-label="(\w+)"', html))
    names |= set(re.findall(r'data-act="(\w+)"', html)) - {"home"}
    prefixes = set(re.findall(r"\bL\[`(\w+)\$\{", js))
    return names, prefixes


def test_every_entry_has_both_languages_with_the_same_fields():
    raw = {}
    for path in catalogue_files():
        entries = json.loads(path.read_text(encoding="utf-8"))
        assert not set(entries) & set(raw), f"{path.name}: keys also elsewhere"
        raw |= entries
    for key, entry in raw.items():
        if "same_as" in entry:
            assert (
                set(entry) == {"same_as"}
                and entry["same_as"] in raw
                and "same_as" not in raw[entry["same_as"]]
            ), key
            continue
        assert set(entry) == set(LANGS), f"{key}: {sorted(entry)}"
        en, zh = (entry[lang] if isinstance(entry[lang], list) else [entry[lang]] for lang in LANGS)
        assert all(isinstance(t, str) and t for t in en + zh), key
        assert len(en) == len(zh), key
        for a, b in zip(en, zh):
            assert fields(a) == fields(b), f"{key}: {fields(a)} in English, {fields(b)} in Chinese"


def test_the_players_templates_are_plain_fields():
    """The player's fmt() fills {name} only: no format specs, conversions or indexing."""
    for key, entry in catalogue().items():
        if key.startswith(PLAYER_PREFIX):
            for text in (t for lang in LANGS for t in texts(entry[lang])):
                for _, name, spec, conv in string.Formatter().parse(text):
                    assert name is None or (re.fullmatch(r"\w+", name) and not spec and not conv), (
                        key,
                        text,
                    )


def test_every_key_the_python_code_uses_is_there():
    keys = set(catalogue())
    literal, prefixes = python_keys()
    assert literal and not literal - keys, sorted(literal - keys)
    for prefix in prefixes:
        assert any(k.startswith(prefix) for k in keys), prefix
    # the keys built at run time, from what they are built of
    from paged_kv_lab.ui.modelstate import DEVICES, MODELS

    built = [f"model_{m}" for m in MODELS] + [f"device_{d}" for d in DEVICES]
    built += [f"why.{m}" for m in ("request", "block", "two", "order", "calls")]
    built += [f"live.{f}" for f in ("endpoint", "replay", "orphans", "unknown_tokens")]
    assert not set(built) - keys, sorted(set(built) - keys)
    assert {f"playground.help.{n}" for n in ("block_size", "num_gpu_blocks", "admission")} <= keys


def test_every_word_the_player_reads_is_there_in_both_languages():
    from paged_kv_lab.recording.events import EventKind
    from paged_kv_lab.ui.player_component import UNTIL_KINDS

    names, prefixes = player_names()
    assert prefixes == {"kind_"}
    for lang in LANGS:
        words = player_strings(lang)
        assert not names - set(words), (lang, sorted(names - set(words)))
        assert {f"kind_{k}" for k in UNTIL_KINDS} <= set(words)
        kinds = {k[len("kind_") :] for k in words if k.startswith("kind_")}
        assert kinds <= {k.value for k in EventKind}, kinds - {k.value for k in EventKind}
        # the budget chart's phases
        assert {"prefill", "chunk", "decode", "recompute"} <= set(words)


def test_every_fmt_call_fills_the_fields_its_template_names():
    calls = re.findall(r"\bfmt\(L\.(\w+),\s*\{([^}]*)\}\)", js_sources())
    assert len(calls) >= 6
    for name, obj in calls:
        given = {part.split(":")[0].strip() for part in obj.split(",") if part.strip()}
        for lang in LANGS:
            assert fields(player_strings(lang)[name]) == given, (name, lang, given)


def test_every_entry_is_used():
    from paged_kv_lab.content.registry import pages, sections

    literal, prefixes = python_keys()
    # the page registry's data names the pages' and sections' titles and summaries
    literal |= {s.title for s in sections()} | {k for p in pages() for k in (p.title, p.summary)}
    names, js_prefixes = player_names()
    phases = {"prefill", "chunk", "decode", "recompute"}  # the budget chart's L[phase]

    shown_by_data = {k for x in BY_ID.values() for k in x.texts()} | {
        k for case in CASES for k in case.texts()
    }  # lessons and cases name their keys by convention (lesson/catalog.py)

    def used(key: str) -> bool:
        if key in literal | shown_by_data or any(key.startswith(p) for p in prefixes):
            return True
        name = key[len(PLAYER_PREFIX) :] if key.startswith(PLAYER_PREFIX) else None
        return name is not None and (
            name in names | phases or any(name.startswith(p) for p in js_prefixes)
        )

    unused = [k for k in catalogue() if not used(k)]
    assert not unused, unused


@pytest.mark.parametrize("lang", LANGS)
def test_tr_fills_fields_and_reads_lists(lang):
    assert tr("model_failed", lang, model="m", device="cpu", error="boom").count("boom") == 1
    assert len(tr("req_table_cols", lang)) == 8
    assert tr("player.req_cols", lang) == tr("req_table_cols", lang)  # written once: same_as
    assert player_strings(lang)["req_cols"] == list(tr("req_table_cols", lang))
    assert "{" in tr("live.intro", lang) and "{{" not in tr("live.intro", lang)
    assert tr("no such key", lang) == "no such key"


def test_a_text_is_a_key_and_fields_rendered_in_any_language(tmp_path, monkeypatch):
    """One Text type, one lookup; nested Text fields render in the same language; a language
    added from a data folder alone (PAGED_KV_LAB_TEXT_DIRS) is offered and used."""
    key = next(k for k, e in catalogue().items() if isinstance(e["en"], str) and "{" not in e["en"])
    (tmp_path / "languages.json").write_text('{"xx": "Pseudo"}', encoding="utf-8")
    (tmp_path / "all.json").write_text(
        json.dumps({key: {"xx": "[[" + catalogue()[key]["en"] + "]]"}}), encoding="utf-8"
    )
    assert tr(Text(key), "zh") == catalogue()[key]["zh"]
    monkeypatch.setenv("PAGED_KV_LAB_TEXT_DIRS", str(tmp_path))
    from paged_kv_lab.text.i18n import languages

    assert list(languages()) == ["en", "zh", "xx"]
    assert tr(Text(key), "xx") == "[[" + catalogue()[key]["en"] + "]]"
