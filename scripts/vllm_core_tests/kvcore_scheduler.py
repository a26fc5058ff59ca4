"""The second adapter mode: vLLM 0.34.0's scheduler tests get kvcore's own Scheduler.

Loaded by the root conftest (conftest.py beside this file) when YARDSTICK_SCHEDULER=1, after the
block-layer swap. It replaces ``create_scheduler`` of vLLM's tests/v1/core/utils.py (which
test_scheduler.py imports by name) with one that builds vLLM's ``VllmConfig`` exactly as vLLM's
helper does (by calling it), then builds kvcore's ``Scheduler`` over kvcore's ``KVCacheManager``
from that config, with the KV connector vLLM's factory made for it. What the tests hand the
scheduler stays vLLM's: its ``Request`` objects (kvcore's code reads them by vLLM's names), its
``ModelRunnerOutput`` and ``KVConnectorOutput``; what comes back is translated only in shape
(``EngineCoreOutputs`` per client from the tokens kvcore appended and the statuses it set).

Thin translation only: every setting kvcore's Scheduler has no parameter for raises
``Unmodelled`` with the feature named; no behaviour lives here. This file runs under vLLM's
interpreter only.
"""

from __future__ import annotations

import inspect
import sys
from collections import defaultdict


def install(Unmodelled):  # noqa: N803  (the conftest's exception class)
    import tests.v1.core.utils as tu
    import vllm.v1.outputs as vo
    import vllm.v1.request as vr
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
    from vllm.v1.metrics.stats import SchedulerStats

    import kvcore.core.kv_cache_manager as kkm
    import kvcore.core.sched.scheduler as ks
    import kvcore.kv_cache_interface as ki
    import kvcore.request as kr
    from kvcore.config.scheduler import SchedulerConfig

    # kvcore's code sets and compares statuses by name; the tests compare them with vLLM's enum,
    # so kvcore's modules use vLLM's (its "finished" is vLLM's is_finished).
    vstatus = vr.RequestStatus
    vstatus.finished = property(lambda s: vstatus.is_finished(s))
    for name, mod in list(sys.modules.items()):
        if name.startswith("kvcore.") and mod is not None and mod is not kr:
            if getattr(mod, "RequestStatus", None) is kr.RequestStatus:
                mod.RequestStatus = vstatus

    # kvcore's Request names three sampling settings directly; vLLM's keeps them in
    # sampling_params and eos_token_id (kvcore: a set of end tokens).
    def sampling(req):
        return req.sampling_params

    # vLLM's SamplingParams leaves eos_token_id None under ignore_eos, so its check reads only it
    vr.Request.ignore_eos = False
    vr.Request.eos_token_ids = property(
        lambda r: frozenset(
            ()
            if sampling(r) is None or sampling(r).eos_token_id is None
            else (sampling(r).eos_token_id,)
        )
    )
    vr.Request.stop_token_ids = property(
        lambda r: frozenset((sampling(r).stop_token_ids or ()) if sampling(r) else ())
    )

    # vLLM 0.34 bounds a request's prefix-cache hit by prefix_cache_hit_limit (0: it reads no
    # hit, as 0.33's skip_reading_prefix_cache; more: prompt scoring from prompt_logprob_start,
    # refused in add_request), and its ModelRunnerOutput lists the requests without the index
    # by id that kvcore reads (0.33's req_id_to_index).
    vr.Request.skip_reading_prefix_cache = property(lambda r: r.prefix_cache_hit_limit == 0)
    vo.ModelRunnerOutput.req_id_to_index = property(
        lambda o: {rid: i for i, rid in enumerate(o.req_ids)}
    )

    original = tu.create_scheduler
    signature = inspect.signature(original)

    def spec_of(spec):
        """kvcore's spec for vLLM's, or Unmodelled."""
        kind = type(spec).__name__
        if kind == "FullAttentionSpec" and getattr(spec, "sliding_window", None) is None:
            if getattr(spec, "attention_chunk_size", None):
                raise Unmodelled("chunked local attention")
            return ki.FullAttentionSpec(spec.block_size)
        if kind == "SlidingWindowSpec":
            return ki.SlidingWindowSpec(spec.block_size, spec.sliding_window)
        if kind == "MambaSpec":
            return ki.MambaSpec(
                spec.block_size,
                mamba_cache_mode=spec.mamba_cache_mode,
                num_speculative_blocks=spec.num_speculative_blocks,
            )
        raise Unmodelled(f"KV cache spec {kind}")

    def create_scheduler(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        unmodelled = [
            (a["async_scheduling"], "async scheduling (AsyncScheduler)"),
            (a["scheduler_cls"] is not None, "vLLM's Scheduler subclasses (scheduler_cls)"),
            (a["diffusion_canvas_length"] is not None, "diffusion models"),
            (a["use_ec_connector"], "encoder-cache (EC) connectors"),
            (a["pipeline_parallel_size"] > 1, "pipeline parallelism"),
            (a["data_parallel_size"] > 1, "data parallelism"),
            (a["max_num_active_seqs"] is not None, "max_num_active_seqs"),
            (a["long_prefill_token_threshold_adaptive"], "adaptive long-prefill threshold"),
            (a["disable_chunked_mm_input"] or a["mm_encoder_only"], "multimodal encoder inputs"),
            (a["prefill_schedule_interval"] != 1, "prefill_schedule_interval"),
            (a["lora_config"] is not None, "LoRA scheduling limits (max_loras)"),
            (a["runner"] != "auto", "pooling models"),
            (a["per_request_spec_decode_metrics"] != "none", "spec-decode metrics"),
            (a["speculative_config"] is not None, "speculative decoding other than n-gram"),
            (
                a["speculative_method"] not in (None, "ngram"),
                "speculative decoding other than n-gram",
            ),
            (a["num_speculative_tokens_per_batch_size"] is not None, "per-batch-size drafts"),
        ]
        for flagged, feature in unmodelled:
            if flagged:
                raise Unmodelled(feature)
        return from_vllm(original(*args, **kwargs))

    def from_vllm(vllm_scheduler):
        """kvcore's Scheduler for what vLLM's helper built: its config, its KV cache config and
        the connector vLLM's factory made."""
        config = vllm_scheduler.vllm_config
        kv_cache_config = vllm_scheduler.kv_cache_manager.kv_cache_config
        if len(kv_cache_config.kv_cache_groups) != 1:
            raise Unmodelled("several KV cache groups built by create_scheduler")
        group = kv_cache_config.kv_cache_groups[0]
        spec = spec_of(group.kv_cache_spec)
        groups = (ki.KVCacheGroupSpec(tuple(group.layer_names), spec),)
        sc = config.scheduler_config
        max_model_len = config.model_config.max_model_len
        spec_cfg = config.speculative_config
        kv_events = config.kv_events_config
        kvm = kkm.KVCacheManager(
            ki.KVCacheConfig(kv_cache_config.num_blocks, groups),
            max_model_len,
            config.cache_config.enable_prefix_caching,
            sc.max_num_batched_tokens,
            0.0,
            enable_kv_cache_events=bool(kv_events and kv_events.enable_kv_cache_events),
            hash_block_size=spec.block_size,
        )
        scheduler = KvcoreScheduler(
            SchedulerConfig(
                max_num_seqs=sc.max_num_seqs,
                max_num_batched_tokens=sc.max_num_batched_tokens,
                policy=sc.policy,
                max_model_len=max_model_len,
                long_prefill_token_threshold=sc.long_prefill_token_threshold,
                enable_chunked_prefill=sc.enable_chunked_prefill,
                num_spec_tokens=spec_cfg.num_speculative_tokens if spec_cfg else 0,
                cache_aware_admission_window=sc.cache_aware_admission_window,
                cache_aware_admission_threshold=sc.cache_aware_admission_threshold,
                max_num_inflight_kv_loads=sc.max_num_inflight_kv_loads,
            ),
            kvm,
            vllm_scheduler.connector,
            config.kv_transfer_config.kv_load_failure_policy
            if config.kv_transfer_config is not None
            else "fail",
        )
        scheduler.vllm_config = config
        scheduler.ec_connector = None  # kvcore has no encoder-cache connector (refused)
        scheduler.block_size = spec.block_size
        return scheduler

    def patch_test_module(module) -> None:
        """test_scheduler.py's own builder of a priority scheduler, given kvcore's too."""
        own = getattr(module, "create_scheduler_with_priority", None)
        if own is None or getattr(own, "kvcore", False):
            return
        own_signature = inspect.signature(own)

        def create_scheduler_with_priority(*args, **kwargs):
            bound = own_signature.bind(*args, **kwargs)
            bound.apply_defaults()
            a = bound.arguments
            if a["use_ec_connector"]:
                raise Unmodelled("encoder-cache (EC) connectors")
            if a["disable_chunked_mm_input"]:
                raise Unmodelled("multimodal encoder inputs")
            return from_vllm(own(*args, **kwargs))

        create_scheduler_with_priority.kvcore = True
        module.create_scheduler_with_priority = create_scheduler_with_priority

    class KvcoreScheduler(ks.Scheduler):
        """kvcore's Scheduler answering in vLLM's shapes where only the shape differs."""

        def update_from_output(self, scheduler_output, model_runner_output):
            scheduled = [
                self.requests[rid]
                for rid in scheduler_output.num_scheduled_tokens
                if rid in self.requests
            ]
            before = {r.request_id: len(r.output_token_ids) for r in scheduled}
            finished = super().update_from_output(scheduler_output, model_runner_output)
            outputs = defaultdict(list)
            for req in scheduled:
                new = list(req.output_token_ids[before[req.request_id] :])
                done = req.request_id in finished
                if new or done:
                    outputs[req.client_index].append(
                        EngineCoreOutput(
                            request_id=req.request_id,
                            new_token_ids=new,
                            finish_reason=req.get_finished_reason() if done else None,
                            stop_reason=req.stop_reason,
                            trace_headers=req.trace_headers,
                        )
                    )
            engine_core_outputs = {
                client: EngineCoreOutputs(outputs=outs) for client, outs in outputs.items()
            }
            # the step's statistics as vLLM's SchedulerStats, read from kvcore's counters (the
            # caller of kvcore's scheduler takes them each step, as vLLM's make_stats does)
            connector_stats = self.connector_prefix_cache_stats
            if connector_stats is not None:
                self.connector_prefix_cache_stats = type(connector_stats)()
            num_running, num_waiting = self.get_request_counts()
            stats = SchedulerStats(
                num_running_reqs=num_running,
                num_waiting_reqs=num_waiting,
                kv_cache_usage=self.kv_cache_manager.usage,
                prefix_cache_stats=self.kv_cache_manager.make_prefix_cache_stats(),
                connector_prefix_cache_stats=connector_stats,
            )
            eco = next(iter(engine_core_outputs.values()), None)
            if eco is None:
                engine_core_outputs[0] = eco = EngineCoreOutputs()
            eco.scheduler_stats = stats
            return engine_core_outputs

        def add_request(self, request) -> None:
            params = request.sampling_params
            unmodelled = [
                (request.pooling_params is not None, "pooling models"),
                (bool(request.mm_features), "multimodal encoder inputs"),
                (request.lora_request is not None, "LoRA scheduling limits (max_loras)"),
                (request.structured_output_request is not None, "structured outputs"),
                (params is not None and params.min_tokens > 0, "min_tokens"),
                (
                    params is not None and params.repetition_detection is not None,
                    "repetition detection",
                ),
                (request.resumable, "streaming (resumable) requests"),
                (
                    request.prefix_cache_hit_limit not in (None, 0),
                    "prompt scoring from a prompt position (prompt_logprob_start)",
                ),
            ]
            for flagged, feature in unmodelled:
                if flagged:
                    raise Unmodelled(feature)
            super().add_request(request)

        def update_draft_token_ids(self, draft_token_ids) -> None:
            # vLLM hands a DraftTokenIds (parallel lists); kvcore takes them by request id
            super().update_draft_token_ids(
                dict(zip(draft_token_ids.req_ids, draft_token_ids.draft_token_ids))
            )

        def get_num_unfinished_requests(self) -> int:
            num_running, num_waiting = self.get_request_counts()
            return num_running + num_waiting

    tu.create_scheduler = create_scheduler
    return patch_test_module
