"""Our engine driven through the operations of a recorded vLLM 0.33.0 KV-event fixture
(tests/fixtures/vllm-kv-events): its settings, its requests' tokens, its steps. Shared by
tests/kvcore/test_kv_events.py (the events and bytes) and tests/lab/test_watch.py (the watcher
on the same ops)."""

from dataclasses import replace

from kvcore.distributed import kv_events as ke
from paged_kv_lab.run.engine import Engine
from paged_kv_lab.run.scenario import EngineSettings, RequestSpec, Scenario


# -- our engine, driven through the fixture's operations ---------------------------------------
class FixtureRunner:
    """Samples the recorded output tokens, in order, for every request whose prefill is done."""

    def __init__(self, outputs: dict[str, list[int]]) -> None:
        self.outputs = outputs
        self.sampled = {rid: 0 for rid in outputs}

    def execute(self, items):
        out = {}
        for it in items:
            if it.sample:
                out[it.request_id] = self.outputs[it.request_id][self.sampled[it.request_id]]
                self.sampled[it.request_id] += 1
        return out


def engine_for(expected, **publish) -> Engine:
    """Our engine with the fixture's settings; ``publish`` (endpoint=..., replay_endpoint=...,
    topic=...) turns on the ZeroMQ publisher."""
    st = expected["settings"]
    groups = st["kv_cache_groups"]
    window = next((g["sliding_window"] for g in groups if g["sliding_window"]), None)
    layer_types = None
    if window is not None:
        layer_types = tuple(
            "sliding_attention" if g["sliding_window"] else "full_attention" for g in groups
        )
    settings = EngineSettings(
        block_size=st["block_size"],
        num_gpu_blocks=st["num_gpu_blocks"],
        hash_algo=st["prefix_caching_hash_algo"],
        max_num_seqs=st["max_num_seqs"],
        max_num_batched_tokens=st["max_num_batched_tokens"],
        max_model_len=st["max_model_len"],
        sliding_window=window,
        layer_types=layer_types,
    )
    outputs = {
        op["req"]: op["output_tokens"] for op in expected["ops"] if op["op"] == "add_request"
    }
    settings = replace(settings, hash_seed=st["none_hash_seed"])  # vLLM ran with PYTHONHASHSEED=0
    config = ke.KVEventsConfig(
        enable_kv_cache_events=bool(publish),
        use_int_block_hashes=st["VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"],
        **publish,
    )
    eng = Engine(
        Scenario(model="tiny-random", engine=settings),
        runner=FixtureRunner(outputs),
        kv_events=config,
    )
    assert eng.hasher.none_hash.hex() == st["none_hash_sha256"]
    return eng


def run_ops(expected, eng=None) -> list[ke.KVEventBatch]:
    """Our engine through the fixture's ops; the KV event batch of every step that had one."""
    own = eng is None
    eng = eng or engine_for(expected)
    batches = []

    def step():
        eng.step()
        if eng.last_kv_event_batch is not None:
            batches.append(eng.last_kv_event_batch)

    for op in expected["ops"]:
        if op["op"] == "add_request":
            eng.add_request(
                RequestSpec(
                    id=op["req"],
                    prompt_token_ids=tuple(op["tokens"]),
                    max_tokens=op["max_tokens"],
                    cache_salt=op.get("cache_salt"),
                )
            )
        elif op["op"] == "step":
            step()
        elif op["op"] == "run_until_idle":
            # vLLM's count includes one last step that only reports the finished requests
            # (has_requests() is still true then); that step has no events.
            n = 0
            while eng.scheduler.has_unfinished_requests():
                step()
                n += 1
            assert n == op["steps"] - 1, f"{op}: we took {n} steps"
        elif op["op"] == "reset_prefix_cache":
            assert eng.reset_prefix_cache() is op["result"]
    if own:
        eng.close()
    return batches
