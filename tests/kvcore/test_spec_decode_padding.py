"""vLLM 0.33's padding of a one-token admission to the 1 + num_spec_tokens rows of a speculative
decode (``pad_spec_decode`` in ``Scheduler.schedule``): when it happens and when not, with the
blocks it costs worked out by hand; the placeholder drafts (-1) rolled back after the step; the
engine never feeds a placeholder to the model and its greedy tokens stay generate's."""

import pytest

from kvcore.core.sched.scheduler import Scheduler
from kvcore.outputs import ModelRunnerOutput
from kvcore.request import Request
from kvcore.structured_output.utils import strip_speculative_padding
from paged_kv_lab.recording import events
from paged_kv_lab.recording.recorder import Recorder
from paged_kv_lab.run.engine import (
    block_hasher_for,
    kv_cache_groups,
    kv_cache_manager_for,
    scheduler_config_for,
)
from paged_kv_lab.run.scenario import EngineSettings, SpeculativeConfig
from paged_kv_lab.why.sentences import SENTENCES, Style, sentence

K = 4  # drafts per step
BS = 4  # block size: the padded rows of a 9-token prompt hit at 8 reach into a 4th block
PROMPT = list(range(10, 19))  # 9 tokens: 2 full blocks (8 tokens) can be hit, 1 token left


def scheduler(num_gpu_blocks=16, max_model_len=64, max_num_batched_tokens=64, k=K):
    s = EngineSettings(
        block_size=BS,
        num_gpu_blocks=num_gpu_blocks,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        speculative=SpeculativeConfig(num_speculative_tokens=k),
    )
    groups, _ = kv_cache_groups(s, 1)
    kvm = kv_cache_manager_for(s, groups, max_model_len, enable_kv_cache_events=False)
    sched = Scheduler(scheduler_config_for(s, max_model_len), kvm)
    sched.recorder = Recorder().attach(kvm)
    sched.hasher = block_hasher_for(s)
    return sched


def add(sched, rid, prompt=PROMPT, max_tokens=8):
    sched.add_request(Request(rid, list(prompt), max_tokens, block_hasher=sched.hasher))


def finish_step(sched, out, tokens):
    """The model's output for the step: ``tokens[rid]`` for each request that samples."""
    sched.update_from_output(out, ModelRunnerOutput.from_token_lists(list(tokens), tokens))


def running_with_drafts(sched, rid="r1", drafts=(1, 2, 3, 4)):
    """``rid`` prefilled PROMPT and holds real drafts for its next step."""
    add(sched, rid)
    out = sched.schedule()
    assert out.num_scheduled_tokens == {rid: len(PROMPT)}
    finish_step(sched, out, {rid: [100]})
    sched.update_draft_token_ids({rid: list(drafts)})


def blocks(sched, rid):
    return sched.kv_cache_manager.get_block_ids(rid)[0]


def test_a_one_token_admission_beside_a_speculative_decode_is_padded_and_rolled_back():
    sched = scheduler()
    running_with_drafts(sched)
    add(sched, "r2")
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"r1": 1 + K, "r2": 1 + K}
    assert out.scheduled_spec_decode_tokens == {"r1": [1, 2, 3, 4], "r2": [-1] * K}
    # r2 hit r1's 2 full blocks; its rows are positions 8..12, so it takes 2 new blocks where
    # its one real token would take 1
    assert blocks(sched, "r2")[:2] == blocks(sched, "r1")[:2]
    assert len(blocks(sched, "r2")) == 4
    assert sched.requests["r2"].num_computed_tokens == 8 + 1 + K
    finish_step(sched, out, {"r1": [1, 7], "r2": [55]})
    r2 = sched.requests["r2"]
    # every placeholder is rejected: back to its real tokens; the blocks stay, as in vLLM
    assert (r2.num_computed_tokens, r2.num_tokens) == (9, 10)
    assert len(blocks(sched, "r2")) == 4
    (rejected,) = events_of_recorder(sched, events.DRAFT_REJECTED, "r2")
    assert rejected.rejected_token_ids == (-1,) * K and rejected.positions == (9, 10, 11, 12)


def events_of_recorder(sched, kind, rid):
    return [e for e in sched.recorder.events if e.kind == kind and e.request_id == rid]


def test_a_lone_request_with_computed_tokens_is_padded_one_without_is_not():
    sched = scheduler()
    add(sched, "r1", max_tokens=1)
    finish_step(sched, sched.schedule(), {"r1": [100]})  # finishes; its blocks stay cached
    add(sched, "r2")
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"r2": 1 + K}  # nothing runs, but 8 tokens were hit
    assert out.scheduled_spec_decode_tokens == {"r2": [-1] * K}
    sched = scheduler()
    add(sched, "one", prompt=[5])
    out = sched.schedule()  # one token left, none computed, nothing running: no padding
    assert out.num_scheduled_tokens == {"one": 1} and not out.scheduled_spec_decode_tokens


def test_no_padding_beside_a_prefill_chunk():
    sched = scheduler(max_num_batched_tokens=20)
    add(sched, "r1", max_tokens=1)
    finish_step(sched, sched.schedule(), {"r1": [100]})
    add(sched, "long", prompt=list(range(200, 230)))
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"long": 20}
    finish_step(sched, out, {})
    add(sched, "r2")
    out = sched.schedule()  # the last 10 of the prompt leave 10: room for 1 + K rows
    assert out.num_scheduled_tokens == {"long": 10, "r2": 1}
    assert not out.scheduled_spec_decode_tokens


def test_padding_that_does_not_fit_the_token_budget_waits_for_the_next_step():
    sched = scheduler(max_num_batched_tokens=1 + K + K)  # r1's 1 + K leave K: one row short
    running_with_drafts(sched)
    add(sched, "r2")
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"r1": 1 + K}  # not r2 unpadded: vLLM waits
    (blocked,) = events_of_recorder(sched, events.BLOCKED, "r2")
    assert (blocked.reason, blocked.token_budget) == ("spec_decode_padding", K)
    assert sched.requests["r2"].num_computed_tokens == 0 and not blocks(sched, "r2")


@pytest.mark.parametrize("max_model_len, padded", [(8 + 1 + K, False), (8 + 1 + K + 1, True)])
def test_padding_only_where_the_rows_and_the_sampled_token_fit_max_model_len(max_model_len, padded):
    sched = scheduler(max_model_len=max_model_len)
    running_with_drafts(sched, drafts=(1,))
    add(sched, "r2", max_tokens=1)
    out = sched.schedule()
    assert out.num_scheduled_tokens["r2"] == (1 + K if padded else 1)
    assert ("r2" in out.scheduled_spec_decode_tokens) == padded


def test_no_padding_without_sampled_tokens_or_when_an_aligned_split_clips_it():
    sched = scheduler()
    sched.num_sampled_tokens_per_step = 0  # vLLM's pooling and diffusion models
    running_with_drafts(sched)
    add(sched, "r2")
    assert sched.schedule().num_scheduled_tokens["r2"] == 1
    sched = scheduler()
    running_with_drafts(sched)
    # an align-mode Mamba split that ends the padded rows early (at 2 of 1 + K)
    sched.need_mamba_block_aligned_split = True
    sched._mamba_block_aligned_split = lambda request, n, *a: 2 if request.request_id == "r2" else n
    add(sched, "r2")
    out = sched.schedule()
    assert out.num_scheduled_tokens["r2"] == 1 and "r2" not in out.scheduled_spec_decode_tokens
    assert len(blocks(sched, "r2")) == 3  # 8 hit + 1 token: one new block


def test_placeholders_are_stripped_where_proposed_drafts_are_read():
    assert strip_speculative_padding([-1, -1]) == []
    assert strip_speculative_padding([4, 5]) == [4, 5]
    assert strip_speculative_padding([4, -1]) == [4]


def decode(ids):
    """A tokenizer's decode that has no word for a placeholder."""
    assert min(ids) >= 0, "a placeholder draft was shown as a token"
    return "tok" + "_".join(map(str, ids))


def test_a_padded_step_is_narrated_as_placeholders_not_as_drafts():
    sched = scheduler()
    running_with_drafts(sched)
    add(sched, "r2")
    out = sched.schedule()
    finish_step(sched, out, {"r1": [1, 7], "r2": [55]})
    (scheduled,) = events_of_recorder(sched, events.SCHEDULED, "r2")
    (rejected,) = events_of_recorder(sched, events.DRAFT_REJECTED, "r2")
    (real,) = events_of_recorder(sched, events.DRAFT_REJECTED, "r1")
    assert scheduled.num_placeholder_tokens == K
    style = Style(decode)
    assert SENTENCES[scheduled.kind](scheduled, style).key == "event.scheduled.padded"
    assert SENTENCES[rejected.kind](rejected, style).key == "event.draft_rejected.padding.other"
    assert SENTENCES[real.kind](real, style).key == "event.draft_rejected.other"
    for lang in ("en", "zh"):
        for e in (scheduled, rejected):
            text = sentence(e, lang, decode)
            assert "{" not in text and str(K) in text, text
