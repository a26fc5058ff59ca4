"""vLLM 0.34's in-flight KV loads (SchedulerConfig.max_num_inflight_kv_loads) on a model-free P/D
pair: with the cap set, a decode request's pull starts while the decode replica's running batch
is full, and the request runs as soon as a slot frees; without it (vLLM's default), the pull
waits for the slot. The cap counts loads in progress and landed loads waiting for a slot."""

from kvcore.metrics.stats import KV_FETCH_COMPLETED_WAITING, KV_FETCH_IN_PROGRESS
from paged_kv_lab.disagg.pd import DECODE, PDEngine
from paged_kv_lab.run.engine import NoModelRunner
from paged_kv_lab.run.scenario import EngineSettings, RequestSpec, Scenario


def pd_pair(**engine) -> PDEngine:
    """A long-running request A, then B and C: one running slot on the decode replica."""
    settings = dict(block_size=4, num_gpu_blocks=32, max_num_seqs=1, hash_algo="sha256")
    reqs = (
        RequestSpec("A", prompt_token_ids=tuple(range(1, 9)), max_tokens=12, ignore_eos=True),
        RequestSpec(
            "B",
            prompt_token_ids=tuple(range(20, 30)),
            max_tokens=2,
            ignore_eos=True,
            arrival_step=1,
        ),
        RequestSpec(
            "C",
            prompt_token_ids=tuple(range(40, 50)),
            max_tokens=2,
            ignore_eos=True,
            arrival_step=1,
        ),
    )
    sc = Scenario(name="inflight", engine=EngineSettings(**settings, **engine), requests=reqs)
    return PDEngine(sc, runner_factory=NoModelRunner, debug=True)


def decode_steps(pd: PDEngine) -> list[dict]:
    """Per decode step: the pulls it started, what ran, and the scheduler's load counts."""
    out = []
    sched = pd.decode_engine.scheduler
    while pd.has_unfinished() and pd.tick < 200:
        for rec in pd.step():
            if rec.replica == DECODE:
                out.append(
                    {
                        "pulls": set(rec.pulls),
                        "ran": set(rec.scheduled),
                        "running": {r.request_id for r in sched.running},
                        "counts": dict(sched._kv_fetch_counts),
                    }
                )
    assert not pd.has_unfinished()
    return out


def first(steps, pred, after: int = -1) -> int:
    return next(i for i, s in enumerate(steps) if i > after and pred(s))


def a_gone(steps) -> int:
    """The first decode step after A started running in which A no longer runs."""
    return first(steps, lambda s: "A" not in s["running"], first(steps, lambda s: "A" in s["ran"]))


def test_without_a_cap_a_pull_waits_for_a_running_slot():
    steps = decode_steps(pd_pair())
    b_pull = first(steps, lambda s: "B" in s["pulls"])
    assert b_pull > a_gone(steps)  # not while A holds the one slot
    assert first(steps, lambda s: "B" in s["ran"]) > b_pull
    assert pd_pair().decode_engine.scheduler.async_kv_waiting.__len__() == 0


def test_with_a_cap_pulls_start_while_the_batch_is_full_and_run_when_a_slot_frees():
    steps = decode_steps(pd_pair(max_num_inflight_kv_loads=1))
    b_pull = first(steps, lambda s: "B" in s["pulls"])
    assert "A" in steps[b_pull]["running"]  # B's pull started beside the full batch
    # the cap is 1: C's pull waits until B has left the count (it runs)
    c_pull = first(steps, lambda s: "C" in s["pulls"])
    b_runs = first(steps, lambda s: "B" in s["ran"])
    assert c_pull >= b_runs
    # its K/V already there, B runs in the step after A's last one
    assert b_runs == a_gone(steps) + 1
    counted = [
        s["counts"][KV_FETCH_IN_PROGRESS] + s["counts"][KV_FETCH_COMPLETED_WAITING] for s in steps
    ]
    assert max(counted) == 1 and counted[-1] == 0


def test_a_cap_of_two_starts_both_pulls_beside_the_full_batch():
    steps = decode_steps(pd_pair(max_num_inflight_kv_loads=2))
    b_pull = first(steps, lambda s: "B" in s["pulls"])
    c_pull = first(steps, lambda s: "C" in s["pulls"])
    assert "A" in steps[b_pull]["running"] and "A" in steps[c_pull]["running"]
