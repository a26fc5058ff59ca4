"""The fleet lesson: the same requests (two conversations and a third guest, one shared system
prompt, ``fleet/lesson.json``) routed over three engines sharing the loaded model, under each
registered policy (fleet/router.py). Step through the decisions: the replicas' pools side by
side, the router's index (built only from the engines' KV events), "why replica N?" in the
policy's own sentence and numbers (``fleet.why.<policy>``), and each policy's hit rate at the end.

Every picture reads the recorded ``FleetMoment``s (fleet/model_fleet.py); a run is computed once
per process and model, under the engine lock, and shared by every session (``FLEETS``, a kind of
the server's one cache: runs/server_cache.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from kvcore.distributed.kv_events import external_hash_text
from paged_kv_lab.fleet.router import policies, router_class
from paged_kv_lab.store.server_cache import Shared, estimate_nbytes
from paged_kv_lab.text.i18n import tr
from paged_kv_lab.ui.panels import painted_grid

LESSON_FILE = Path(__file__).resolve().parent.parent / "fleet" / "lesson.json"
MAX_INDEX_ROWS = 12
DEFAULT_POLICY = "prefix"


def lesson_data() -> dict:
    return json.loads(LESSON_FILE.read_text(encoding="utf-8"))


def fleet_nbytes(moments) -> int:
    """What a computed fleet holds: its moments and the router's index (estimated as a run's
    records are), and each engine's KV cache (bytes per block x blocks, as a run counts its live
    engine); the weights are the loaded model's, counted nowhere here."""
    fleet = moments.fleet
    kv = sum(int(e.bytes_per_block()) * int(e.settings.num_gpu_blocks) for e in fleet.replicas)
    return estimate_nbytes((moments.moments, fleet.routing)) + kv


# (model, device, policy) -> the lesson's fleet moments, run to its end; a failure is not kept
# (the next visit tries again)
FLEETS: Shared[Any] = Shared("fleet lesson", size=fleet_nbytes, keep_errors=False)


def fleet_run(model_name: str, device: str, policy: str, model):
    """The lesson's requests through its fleet under ``policy`` on the loaded model: its
    moments (fleet/model_fleet.py's ``FleetMoments``)."""

    def compute():
        from paged_kv_lab.fleet.model_fleet import run_model_fleet
        from paged_kv_lab.run.scenario import load_scenario
        from paged_kv_lab.ui.modelstate import engine_lock

        d = lesson_data()
        scenario = load_scenario({**d["scenario"], "model": model_name, "device": device})
        with engine_lock():
            return run_model_fleet(scenario, d["replicas"], policy, model, d["sessions"])

    return FLEETS.get((model_name, device, policy), compute)


def prepare_fleet_lesson(ms) -> None:
    """The warm-up's part (app/warm_up.py): the policy a first visit shows, run ahead."""
    from paged_kv_lab.store.server_cache import stop_point

    if ms.model is not None:
        stop_point()
        fleet_run(ms.name, ms.device, DEFAULT_POLICY, ms.model)


POOL_COLS = 12  # a replica's pool is a full-width grid, one below the other
# a block's state on its cell: in use by a request, free but still cached, free and empty
POOL_COLORS = {"used": "#3182bd", "cached": "#9ecae1", "free": "#eeeeee"}
POOL_TEXT = {"used": "#ffffff", "cached": "#000000", "free": "#666666"}


def wire(block_hash: str) -> str:
    """A block's hash as the router's index holds it: the KV event's form (its last 8 bytes)."""
    return external_hash_text(bytes.fromhex(block_hash))


def pool_table(snap):
    """One replica's pool as a grid of POOL_COLS cells, one block each ("id · the first hex digits
    of its hash as the index holds it" when cached), coloured by state (panels.painted_grid)."""
    blocks = [b for b in snap.blocks if not b.is_null]
    cells, states = [], []
    for i in range(0, len(blocks), POOL_COLS):
        row = blocks[i : i + POOL_COLS]
        cells.append(
            [
                f"{b.block_id} · {wire(b.block_hash)[:6]}" if b.block_hash else str(b.block_id)
                for b in row
            ]
            + [""] * (POOL_COLS - len(row))
        )
        states.append(
            [("used" if b.ref_cnt > 0 else "cached" if b.block_hash else "free") for b in row]
            + [""] * (POOL_COLS - len(row))
        )
    colors = {k: (POOL_COLORS[k], POOL_TEXT[k]) for k in POOL_COLORS}
    return painted_grid(cells, states, colors, [str(c) for c in range(POOL_COLS)])


def why_sentence(m, router_settings: dict, lang: str) -> str:
    """'Why replica N?': the policy's own sentence, ``fleet.why.<policy>``, with the numbers of
    the decision it made (and the router settings it compared them with)."""
    d = m.decision
    return tr(router_class(d.policy).why(d, router_settings), lang)


def render_fleet_page() -> None:
    from paged_kv_lab.ui.lesson_page import current_lang, current_model

    lang = current_lang()
    d = lesson_data()
    st.title(f"🚦 {tr('page.fleet.title', lang)}")
    st.caption(tr("fleet.lesson.intro", lang, n=d["replicas"]))
    ms = current_model()
    if ms.model is None:
        st.error(tr("fleet.lesson.no_model", lang))
        return
    names = policies()
    policy = st.radio(
        tr("fleet.lesson.policy", lang),
        names,
        index=names.index(DEFAULT_POLICY),
        horizontal=True,
        key="fleet:policy",
        format_func=lambda p: tr(f"fleet.router.{p}", lang),
    )
    with st.spinner(tr("fleet.lesson.running", lang)):
        run = fleet_run(ms.name, ms.device, policy, ms.model)
    moments = run.moments
    k = st.slider(tr("fleet.lesson.after", lang), 1, len(moments), 1, key="fleet:k")
    m = moments[k - 1]
    n = d["replicas"]
    st.subheader(
        tr(
            "fleet.lesson.decision",
            lang,
            request=m.request_id,
            session=m.session,
            replica=m.decision.replica,
        )
    )
    st.markdown(
        f"**{tr('fleet.lesson.why', lang, replica=m.decision.replica)}** "
        + why_sentence(m, run.fleet.router.settings, lang)
    )
    dec = m.decision
    rows = []
    for i in range(n):
        row = {
            tr("fleet.lesson.col_replica", lang): i,
            tr("fleet.lesson.col_overlap", lang): dec.overlap_blocks[i],
            tr("fleet.lesson.col_load", lang): dec.load[i],
        }
        if dec.score is not None:
            row[tr(f"fleet.lesson.col_{dec.score_name}", lang)] = round(dec.score[i], 3)
        rows.append(row)
    st.dataframe(pd.DataFrame(rows), hide_index=True, key="fleet:decision")
    st.caption(
        tr("fleet.lesson.hit", lang, hit=m.hit_tokens, prompt=m.prompt_tokens, replica=dec.replica)
    )
    st.subheader(tr("fleet.lesson.pools", lang))
    # one grid per replica, one below the other: side by side, a pool's cells were too narrow for
    # a block's id and hash
    blank = {str(c): st.column_config.TextColumn(" ") for c in range(POOL_COLS)}
    for i, snap in enumerate(m.snapshots):
        st.markdown(
            tr(
                "fleet.lesson.pool",
                lang,
                replica=i,
                cached=sum(1 for b in snap.blocks if b.block_hash),
                requests=sum(1 for x in moments[:k] if x.decision.replica == i),
            )
        )
        st.dataframe(pool_table(snap), hide_index=True, column_config=blank, key=f"fleet:pool{i}")
    st.caption(tr("fleet.lesson.pool_legend", lang))
    st.subheader(tr("fleet.lesson.index", lang))
    holders = m.holders
    shared = sum(1 for v in holders.values() if len(v) > 1)
    st.caption(tr("fleet.lesson.index_caption", lang, hashes=len(holders), shared=shared))
    index_rows = [
        {
            tr("fleet.live.col_hash", lang): h[:16],
            tr("fleet.live.col_holders", lang): ", ".join(str(i) for i in v),
        }
        for h, v in sorted(holders.items(), key=lambda kv: (-len(kv[1]), kv[0]))[:MAX_INDEX_ROWS]
    ]
    st.dataframe(pd.DataFrame(index_rows), hide_index=True, key="fleet:index")
    st.subheader(tr("fleet.lesson.compare", lang))
    done = st.session_state.setdefault("fleet:compared", [])
    if policy not in done:
        done.append(policy)
    rest = [p for p in names if p not in done]
    if rest and st.button(tr("fleet.lesson.compare_all", lang), key="fleet:compare_all"):
        done.extend(rest)
        rest = []
    compare = []
    for p in [p for p in names if p in done]:
        f = fleet_run(ms.name, ms.device, p, ms.model)
        compare.append(
            {
                tr("fleet.lesson.col_policy", lang): tr(f"fleet.router.{p}", lang),
                tr("fleet.lesson.col_hit_rate", lang): f"{f.hit_rate():.1%}",
                tr("fleet.lesson.col_placement", lang): " ".join(
                    str(x.decision.replica) for x in f.moments
                ),
            }
        )
    st.dataframe(pd.DataFrame(compare), hide_index=True, key="fleet:compare")
    st.caption(tr("fleet.lesson.compare_caption", lang))
