"""Run files (store/run_files.py): a finished run another process of the same code recorded is
played from disk, exactly as computed, and never when the code, the cap or the budget differ; a
damaged file is recomputed, never shown."""

import os

import pytest

from paged_kv_lab.content import BY_ID, LESSONS
from paged_kv_lab.content.casebook import CASES
from paged_kv_lab.run.budget import BudgetError, Limits
from paged_kv_lab.store import run_files
from paged_kv_lab.store.run_files import ENV_RUN_FILES, ENV_RUN_FILES_BYTES, RunFiles
from paged_kv_lab.store.run_store import RunStore
from paged_kv_lab.store.timeline import lesson_run

pytestmark = pytest.mark.xdist_group("run-files")


def store(files, **kw) -> RunStore:
    return RunStore(files=files, background_pause=0.0, **kw)


def finished(lesson, model, s: RunStore):
    run = lesson_run(lesson, model, store=s)
    run.run_to_end(timeout=120)
    assert run.finished, lesson.id
    return run


def test_every_lesson_and_case_is_kept_and_played_back_as_computed(tiny_model, tmp_path):
    """Each lesson's and each case's run (both sides of its fix) on the tiny model is written, and
    a second store (another process's, as far as it can tell) plays the same records and outputs
    without building an engine."""
    files = RunFiles(tmp_path)
    first = store(files)
    lessons = [*LESSONS, *(c.lesson for c in CASES), *(c.fixed_lesson() for c in CASES)]
    computed = {}
    for lesson in lessons:
        run = finished(lesson, tiny_model, first)
        computed[run.run.key] = run.run
    first.close()
    # every kind of run these record (one engine, P/D, a CPU tier, drafts, hybrid groups) reads
    # back, except a fleet's: its routing decisions are written for the trace viewer but not read
    fleets = {k for k, r in computed.items() if any(rec.routed for rec in r.records)}
    assert fleets, "the lessons include a fleet, whose run must not be kept"
    kept_keys = {p.name[: -len(".jsonl")] for p in files.folder.glob("*.jsonl")}
    assert kept_keys == set(computed) - fleets
    assert files.saved == len(kept_keys)

    again = RunFiles(tmp_path)
    second = store(again)
    with_events = 0
    for lesson in lessons:
        run = lesson_run(lesson, tiny_model, store=second)
        kept = computed[run.run.key]
        if run.run.key in fleets:
            continue  # computed again (``loaded`` below counts the others only)
        assert run.run.done and run.run.engine is None  # nothing was computed
        assert run.run.records == kept.records, lesson.id
        assert run.run.initial == kept.initial and run.run.outputs() == kept.outputs()
        # what the trace format leaves out comes back too: the steps' wall times, and the KV
        # cache events each step queued
        assert [r.seconds for r in run.run.records] == [r.seconds for r in kept.records]
        assert run.run.records[0].seconds > 0
        assert [r.kv_events for r in run.run.records] == [r.kv_events for r in kept.records]
        with_events += any(r.kv_events for r in kept.records)
    assert again.loaded == len(kept_keys)
    assert with_events > 10  # runs whose steps queued KV events were among them
    second.close()


def test_a_damaged_file_is_recomputed_and_replaced(tiny_model, tmp_path):
    files = RunFiles(tmp_path)
    s = store(files)
    key = finished(BY_ID["blocks"], tiny_model, s).run.key
    s.close()
    path = files.folder / f"{key}.jsonl"
    text = path.read_text()
    path.write_text(text[: len(text) // 2])  # cut short, as by a full disk
    s = store(RunFiles(tmp_path))
    run = finished(BY_ID["blocks"], tiny_model, s)
    assert run.run.key == key and len(run.records) > 0
    s.close()  # the worker writes a finished run's file after its last step: wait for it
    assert s.files.loaded == 0 and s.files.saved == 1  # computed, and written whole again
    assert path.read_text() == text


def test_no_file_of_other_code_a_capped_store_or_an_over_budget_scenario(tiny_model, tmp_path):
    files = RunFiles(tmp_path)
    s = store(files)
    run = finished(BY_ID["blocks"], tiny_model, s)
    steps, key = len(run.records), run.run.key
    s.close()

    # another code digest: its folder is not this one's
    other = RunFiles(tmp_path)
    other.folder = tmp_path / "another-digest"
    assert other.load(key) is None

    # a store whose step cap is below the run's length computes (and caps) instead
    capped = store(RunFiles(tmp_path), max_steps=steps - 1)
    short = lesson_run(BY_ID["blocks"], tiny_model, store=capped)
    assert not short.run.done and short.run.engine is not None  # computing, not played
    capped.close()

    # the budget's checks come first: a file never lets a scenario past a limit
    small = store(RunFiles(tmp_path), limits=Limits(max_requests=1))
    with pytest.raises(BudgetError):
        lesson_run(BY_ID["blocks"], tiny_model, store=small)
    assert small.files.loaded == 0
    small.close()

    # keys are the store's hex digests: nothing else names a file
    assert files.load("../../etc/passwd") is None and files.load("") is None


def test_the_files_stay_under_their_budget_oldest_and_other_code_first(tmp_path):
    files = RunFiles(tmp_path, max_bytes=2500)
    old = tmp_path / "old-digest"
    old.mkdir()
    (old / "a.jsonl").write_text("x" * 1000)
    mine = files.folder
    mine.mkdir(parents=True)
    (mine / "b.jsonl").write_text("y" * 1000)
    os.utime(mine / "b.jsonl", (1, 1))  # older than c, but this code's
    (mine / "c.jsonl").write_text("z" * 1000)
    files._trim()
    assert not old.exists()  # another code's files go first, their folder with them
    assert (mine / "b.jsonl").exists() and (mine / "c.jsonl").exists()
    files.max_bytes = 1500
    files._trim()
    assert not (mine / "b.jsonl").exists() and (mine / "c.jsonl").exists()


def test_where_the_files_go_is_read_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_RUN_FILES, "off")
    assert run_files.run_files_from_env() is None
    monkeypatch.setenv(ENV_RUN_FILES, str(tmp_path))
    monkeypatch.setenv(ENV_RUN_FILES_BYTES, "12345")
    files = run_files.run_files_from_env()
    assert files.root == tmp_path and files.max_bytes == 12345
    monkeypatch.setenv(ENV_RUN_FILES_BYTES, "lots")
    with pytest.raises(ValueError, match=ENV_RUN_FILES_BYTES):
        run_files.run_files_from_env()


def test_scenarios_naming_the_device_differently_share_one_run_each_shown_its_own(tiny_model):
    """The loaded model is what runs: a scenario asking for "auto" and one asking for "cpu" share
    the run of that model (the app's and a script's), and each cursor keeps its own scenario."""
    import dataclasses

    from paged_kv_lab.store.timeline import LabRun, lesson_scenario

    s = store(None)
    auto = lesson_scenario(BY_ID["blocks"], tiny_model.num_layers, None, tiny_model.name)
    cpu = dataclasses.replace(auto, device="cpu")
    from paged_kv_lab.disagg.pd import engine_for
    from paged_kv_lab.store.recorded_run import model_key

    mk = model_key(tiny_model.name, tiny_model)
    a = LabRun(auto, lambda sc: engine_for(sc, model=tiny_model), s, model=tiny_model, model_key=mk)
    b = LabRun(cpu, lambda sc: engine_for(sc, model=tiny_model), s, model=tiny_model, model_key=mk)
    assert a.run is b.run
    assert a.scenario.device == "auto" and b.scenario.device == "cpu"
    s.close()
