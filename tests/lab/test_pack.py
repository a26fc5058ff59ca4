"""The class pack's command refuses what it cannot pack before it loads a model, and its pages
keep every text as text: unknown ids and languages are named with the valid ones, the folder must
be new or empty, the entries follow the app's order, and hostile words stay escaped. (The pack in
a real browser, offline: tests/browser/test_browser_pack.py.)"""

import io
import json
import zipfile

import pytest

from paged_kv_lab.classroom.pack_site import (
    IndexEntry,
    IndexPage,
    IndexSection,
    PackRefused,
    check_out_dir,
    index_html,
    quiz_html,
    zip_pack,
)
from paged_kv_lab.cli.main import main
from paged_kv_lab.content.casebook import CASES
from paged_kv_lab.content.registry import pages
from paged_kv_lab.ui.class_pack import pack_items, select_items, select_langs


@pytest.fixture
def no_model(monkeypatch):
    """A refusal must come before any model loads."""
    import kvcore.model

    def refuse(*a, **k):
        raise AssertionError("a refused pack loaded a model")

    monkeypatch.setattr(kvcore.model, "load_model", refuse)


def pack(tmp_path, *args):
    return main(["pack", "--model", "tiny-random", "--device", "cpu", *map(str, args)])


def test_unknown_ids_are_refused_with_the_valid_ones(tmp_path, capsys, no_model):
    assert pack(tmp_path, "--out", tmp_path / "p", "--lessons", "blocks,nope,<b>") == 2
    err = capsys.readouterr().err
    assert "nope, <b>" in err and "all, blocks, prefix" in err and "case-short-prefix" in err
    assert pack(tmp_path, "--out", tmp_path / "p", "--lessons", " , ") == 2
    assert not (tmp_path / "p").exists()


def test_unknown_languages_are_refused(tmp_path, capsys, no_model):
    assert pack(tmp_path, "--out", tmp_path / "p", "--lang", "en,xx") == 2
    err = capsys.readouterr().err
    assert "xx" in err and "en,zh" in err
    assert select_langs(None) == ("en", "zh") and select_langs("zh,zh") == ("zh",)


def test_the_folder_must_be_new_or_empty(tmp_path, capsys, no_model):
    full = tmp_path / "full"
    full.mkdir()
    (full / "notes.txt").write_text("mine")
    assert pack(tmp_path, "--out", full) == 2
    assert f"the folder {full} is not empty" in capsys.readouterr().err
    assert (full / "notes.txt").read_text() == "mine"
    afile = tmp_path / "a.html"
    afile.write_text("x")
    assert pack(tmp_path, "--out", afile, "--lang", "zh") == 2
    assert f"{afile} 是一个文件" in capsys.readouterr().err  # said in the pack's language
    (tmp_path / "empty").mkdir()
    assert check_out_dir(tmp_path / "empty") == tmp_path / "empty"


def test_the_entries_follow_the_apps_order():
    items = pack_items()
    ids = [i.id for i in items]
    order = [p.lesson or p.id for p in pages()]
    placed = [order.index(i.page.lesson or i.page.id) for i in items]
    assert placed == sorted(placed)
    assert [i.id for i in items if i.case] == [c.lesson.id for c in CASES]
    assert [i.id for i in select_items("onehash,blocks")] == ["blocks", "onehash"]
    assert select_items("all") == items and len(set(ids)) == len(ids)


def test_pages_keep_hostile_words_as_text():
    bad = '<img src=x onerror="alert(1)"></script>'
    entry = IndexEntry("a.html", "x", bad, bad, ((bad, "b.html"),))
    page = IndexPage("en", bad, bad, bad, (IndexSection(bad, (entry,)),), entry)
    html = index_html([page])
    assert "<img" not in html and "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in html
    q = {"where": bad, "href": "a.html", "prompt": bad, "options": [bad, "b"], "answer": 1}
    quiz = quiz_html("en", bad, bad, (bad, "../index.html"), {"check": bad}, [q | {"wrong": bad}])
    assert "<img" not in quiz and quiz.count("</script>") == 2
    data = quiz.split('id="pkv-quiz">')[1].split("</script>")[0]
    assert json.loads(data)["questions"][0]["prompt"] == bad


def test_the_zip_holds_one_folder_and_no_path_leaves_it():
    files = {"index.html": "i", "en/a.html": "a"}
    names = zipfile.ZipFile(io.BytesIO(zip_pack(files, "pack"))).namelist()
    assert names == ["pack/index.html", "pack/en/a.html"]
    with pytest.raises(ValueError):
        zip_pack({"../x.html": "x"}, "pack")
    with pytest.raises(PackRefused):
        check_out_dir(__file__)
