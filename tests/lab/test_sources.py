"""Every word right (issue #31): each claim about vLLM, SGLang or nano-vllm in the myths, the
casebook and the topic pages carries its source (the engine's file and a name in it, at the
version modelled), lesson moments may carry theirs, and each cited name is in the engine's own
source where that source is installed.

The data checks run always (and cost nothing). The checks against an engine's source skip, with
the reason, when it is absent: vLLM 0.34.0 in ``VLLM_VENV`` (default /tmp/vllm034-venv, made by
scripts/vllm_env.sh), SGLang 0.5.23 in ``SGLANG_VENV`` (default /tmp/sglang-venv,
scripts/sglang_env.sh), nano-vllm in ``NANO_VLLM_SRC`` (default /tmp/nanovllm-src,
scripts/nanovllm_env.sh; a source naming a commit is read at that commit when it is a git
checkout)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Optional

import pytest

from paged_kv_lab.content import BY_ID, LESSONS
from paged_kv_lab.content.casebook import CASES
from paged_kv_lab.content.myths import load_myths
from paged_kv_lab.content.sources import ENGINES, Source, load_sourced_keys, topic_sources
from paged_kv_lab.text.i18n import CATALOGUE_DIR, content_dir, tr
from paged_kv_lab.why.source_links import FUNCTIONS

# a sentence that says what an engine does: it names one, or quotes a name of its code
NAMES_AN_ENGINE = re.compile(r"vLLM|SGLang|nano-vllm|`")


def all_sources() -> list[tuple[str, Source]]:
    """(where it is cited, the source) for every source the data cites."""
    out = [(f"myth {m.id}", s) for m in load_myths() for s in m.sources]
    out += [(f"case {c.id}", s) for c in CASES for s in c.sources]
    moments = [(lesson.id, m) for lesson in LESSONS for m in lesson.moments]
    moments += [
        (c.id, m) for c in CASES for m in c.lesson.moments + (c.fix.moments if c.fix else ())
    ]
    out += [(f"{lid} moment {m.text}", s) for lid, m in moments for s in m.sources]
    out += [(key, s) for key, sources in topic_sources().items() for s in sources]
    return out


def test_every_myth_case_and_topic_claim_has_its_source():
    assert all(m.sources for m in load_myths())
    assert all(c.sources for c in CASES), [c.id for c in CASES if not c.sources]
    topics = {  # the topics' sentences: each topic folder's, and the pages' shared ones
        k: v
        for path in [CATALOGUE_DIR / "topics.json", *(content_dir() / "topics").glob("*/text.json")]
        for k, v in json.loads(path.read_text(encoding="utf-8")).items()
        if k.startswith("topic.")
    }
    claims = {k for k, v in topics.items() if NAMES_AN_ENGINE.search(json.dumps(v["en"]))}
    assert claims and claims <= set(topic_sources()), sorted(claims - set(topic_sources()))
    assert {s.engine for _, s in all_sources()} <= set(ENGINES)


def test_lesson_10_cites_where_a_cpu_eviction_is_decided():
    moments = [m for m in BY_ID["secondtier"].moments if m.kind == "cpu_evicted"]
    assert len(moments) == 2
    names = {s.name for m in moments for s in m.sources}
    assert names == {
        "BlockPool.get_new_blocks",
        "SimpleCPUOffloadScheduler._process_store_completion",
    }


# a vLLM name a lesson quotes: `snake_case`, or `request.snake_case`; the lab's own values apart
QUOTED_NAME = re.compile(r"`(?:request\.)?([a-z][a-z0-9]*(?:_[a-z0-9]+)+)`")
LAB_VALUES = {"token_budget"}  # an event's reason, as the lab records it


def test_every_vllm_name_a_lesson_moment_quotes_is_cited():
    """The event's own code is linked already (why.source_links: each event kind's call chain);
    a name beyond it must be among the moment's sources."""
    linked = {f.vllm.qualname.rsplit(".", 1)[-1] for f in FUNCTIONS.values()}
    missing = []
    for lesson in LESSONS:
        for m in lesson.moments:
            quoted = set(QUOTED_NAME.findall(tr(m.text, "en"))) - LAB_VALUES
            cited = linked | {s.name.rsplit(".", 1)[-1] for s in m.sources}
            missing += [(m.text, name) for name in sorted(quoted - cited)]
    assert not missing, missing


@pytest.mark.parametrize(
    "entry, said",
    [
        ("- {key: topic.nope, sources: [{file: vllm/x.py, name: f}]}", "the catalogue has no"),
        (
            "- {key: topic.blocksize.waste, sources: []}",
            "[0].sources: Tuple should have at least 1",
        ),
        ("- {key: topic.blocksize.waste, sources: [{file: kvcore/x.py, name: f}]}", "pattern"),
        ("- {key: topic.blocksize.waste, sources: [{file: vllm/x.py, name: a.b.c}]}", "pattern"),
    ],
)
def test_a_malformed_topic_source_names_the_file_and_field(tmp_path, entry, said):
    path = tmp_path / "topics.yaml"
    path.write_text(entry + "\n", encoding="utf-8")
    with pytest.raises(ValueError) as info:
        load_sourced_keys(path)
    assert str(path) in str(info.value) and said in str(info.value)


# -- against each engine's own source ------------------------------------------------------------
def engine_root(engine: str) -> tuple[Optional[Path], str]:
    """(the folder holding the engine's package, why it is missing)."""
    if engine == "nanovllm":
        src = Path(os.environ.get("NANO_VLLM_SRC", "/tmp/nanovllm-src"))
        return (src if (src / "nanovllm").is_dir() else None), (
            f"no nano-vllm source in {src} (`bash scripts/nanovllm_env.sh`, or set NANO_VLLM_SRC)"
        )
    env, default, script = {
        "vllm": ("VLLM_VENV", "/tmp/vllm034-venv", "scripts/vllm_env.sh"),
        "sglang": ("SGLANG_VENV", "/tmp/sglang-venv", "scripts/sglang_env.sh"),
    }[engine]
    venv = Path(os.environ.get(env, default))
    found = sorted(venv.glob(f"lib/python3*/site-packages/{engine}"))
    return (found[0].parent if found else None), (
        f"no {ENGINES[engine]} in {venv} (`bash {script}`, or set {env})"
    )


def source_text(root: Path, s: Source) -> Optional[str]:
    if s.commit and (root / ".git").exists():
        done = subprocess.run(
            ["git", "-C", str(root), "show", f"{s.commit}:{s.file}"],
            capture_output=True,
            text=True,
        )
        return done.stdout if done.returncode == 0 else None
    path = root / s.file
    return path.read_text(encoding="utf-8") if path.is_file() else None


def defines(text: str, name: str) -> bool:
    """``name`` (a function, class or setting; ``Class.member`` for a member) is defined."""
    owner, _, member = name.rpartition(".")
    member_def = rf"^\s*(?:async\s+)?(?:def|class)\s+{member}\b|^\s*(?:self\.)?{member}\s*[:=]"
    if not owner:
        return re.search(member_def, text, re.M) is not None
    m = re.search(rf"^class\s+{owner}\b.*$", text, re.M)
    if m is None:
        return False
    end = re.search(r"^\S", text[m.end() + 1 :], re.M)
    body = text[m.end() : m.end() + 1 + end.start()] if end else text[m.end() :]
    return re.search(member_def, body, re.M) is not None


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_every_cited_name_is_in_the_engines_source(engine):
    cited = [(where, s) for where, s in all_sources() if s.engine == engine]
    if not cited:
        pytest.skip(f"nothing cites {ENGINES[engine]}")
    root, why = engine_root(engine)
    if root is None:
        pytest.skip(why)
    missing = []
    for where, s in cited:
        text = source_text(root, s)
        if text is None or not defines(text, s.name):
            missing.append((where, s.file, s.name, s.commit))
    assert not missing, missing


def test_defines_finds_members_in_their_own_class_only():
    text = (
        "class A:\n    x: int = 1\n\n    def f(self):\n        pass\n\n\n"
        "class B:\n    def g(self):\n        pass\n"
    )
    assert defines(text, "A.f") and defines(text, "A.x") and defines(text, "B.g")
    assert not defines(text, "A.g") and not defines(text, "C.f") and defines(text, "g")
