"""Scenario files: defaults, every kind of mistake reported with its path, round trip."""

import json

import pytest

from paged_kv_lab.run.scenario import (
    EngineSettings,
    RequestSpec,
    Scenario,
    ScenarioError,
    load_scenario,
    scenario_to_dict,
)
from support.paths import ROOT

EXAMPLES = sorted((ROOT / "paged_kv_lab" / "content" / "examples").glob("*.json"))


def problems(source):
    with pytest.raises(ScenarioError) as info:
        load_scenario(source)
    assert str(info.value).startswith("invalid scenario:")
    return info.value.problems


def one_problem(source):
    (p,) = problems(source)
    return p


def test_defaults():
    s = load_scenario({})
    assert s == Scenario()
    assert s.engine == EngineSettings()
    assert s.engine.free_order == "v0.33" and s.engine.admission == "full_sequence"
    assert s.engine.prefix_cache_retention_interval == 0 and s.engine.hash_algo == "xxhash"
    assert s.engine.hash_seed == "vllm-none-hash" and s.engine.watermark == 0.0
    assert s.engine.max_cache_hit_length is None


@pytest.mark.parametrize("old, new", [("sparse", 0), ("dense", None)])
def test_old_sliding_retention_is_read_as_the_retention_interval(old, new):
    s = load_scenario({"engine": {"sliding_retention": old, "sliding_window": 4}})
    assert s.engine.prefix_cache_retention_interval == new
    assert "sliding_retention" not in scenario_to_dict(s)["engine"]
    assert one_problem(
        {"engine": {"sliding_retention": old, "prefix_cache_retention_interval": 0}}
    ).startswith("engine.sliding_retention: give prefix_cache_retention_interval only")


def test_new_settings_load():
    s = load_scenario(
        {
            "engine": {
                "hash_algo": "sha256_cbor",
                "hash_seed": None,
                "watermark": 0.25,
                "max_cache_hit_length": 32,
                "sliding_window": 8,
                "block_size": 4,
                "prefix_cache_retention_interval": 16,
            }
        }
    )
    e = s.engine
    assert (e.hash_algo, e.hash_seed, e.watermark, e.max_cache_hit_length) == (
        "sha256_cbor",
        None,
        0.25,
        32,
    )
    assert e.prefix_cache_retention_interval == 16 and isinstance(
        load_scenario({"engine": {"watermark": 0}}).engine.watermark, float
    )


def test_load_from_dict_json_string_and_file(tmp_path):
    raw = {
        "name": "x",
        "model": "tiny-random",
        "engine": {
            "block_size": 2,
            "num_gpu_blocks": 9,
            "policy": "priority",
            "sliding_window": 4,
            "layer_types": ["full_attention", "sliding_attention"],
        },
        "requests": [
            {"id": "a", "prompt_token_ids": [1, 2, 3], "priority": -1, "cache_salt": "s"},
            {"id": "b", "prompt": "hello", "chat": True, "arrival_step": 2},
        ],
    }
    s = load_scenario(raw)
    assert s.engine.layer_types == ("full_attention", "sliding_attention")
    assert s.requests[0] == RequestSpec(
        "a", prompt_token_ids=(1, 2, 3), priority=-1, cache_salt="s"
    )
    assert (
        s.requests[1].prompt == "hello" and s.requests[1].chat and s.requests[1].arrival_step == 2
    )
    assert load_scenario(json.dumps(raw)) == s
    f = tmp_path / "s.json"
    f.write_text(json.dumps(raw))
    assert load_scenario(f) == s
    assert load_scenario(str(f)) == s


def test_round_trip_through_the_file_format():
    s = load_scenario(
        {
            "engine": {"block_size": 8},
            "requests": [
                {"id": "a", "prompt_token_ids": [1, 2], "max_tokens": 3},
                {"id": "b", "prompt": "hi"},
            ],
        }
    )
    d = scenario_to_dict(s)
    assert d["requests"][1] == {"id": "b", "prompt": "hi"}  # defaults left out
    assert load_scenario(json.loads(json.dumps(d))) == s


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_scenarios_load(path):
    s = load_scenario(path)
    assert s.requests


# -- mistakes, each reported with its path ---------------------------------------------------------
@pytest.mark.parametrize(
    "engine, expect",
    [
        ({"block_size": 0}, "engine.block_size: must be an integer >= 1; got 0"),
        ({"block_size": True}, "engine.block_size: must be an integer >= 1; got True"),
        ({"block_size": "16"}, "engine.block_size: must be an integer >= 1; got '16'"),
        (
            {"num_gpu_blocks": 0},
            "engine.num_gpu_blocks: must be an integer >= 2 (block 0 is the null block",
        ),
        ({"num_gpu_blocks": 1}, "engine.num_gpu_blocks: must be an integer >= 2"),
        ({"max_num_seqs": 0}, "engine.max_num_seqs: must be an integer >= 1"),
        ({"max_num_batched_tokens": -4}, "engine.max_num_batched_tokens: must be an integer >= 1"),
        (
            {"long_prefill_token_threshold": -1},
            "engine.long_prefill_token_threshold: must be an integer >= 0",
        ),
        ({"enable_prefix_caching": "yes"}, "engine.enable_prefix_caching: must be true or false"),
        (
            {"hash_algo": "md5"},
            "engine.hash_algo: must be one of xxhash, sha256, sha256_cbor, xxhash_cbor; got 'md5'",
        ),
        ({"policy": "lifo"}, "engine.policy: must be one of fcfs, priority"),
        ({"free_order": "lru"}, "engine.free_order: must be one of v0.33, legacy"),
        ({"admission": "eager"}, "engine.admission: must be one of full_sequence, first_chunk"),
        ({"sliding_retention": "all"}, "engine.sliding_retention: must be one of sparse, dense"),
        (
            {"prefix_cache_retention_interval": -4},
            "engine.prefix_cache_retention_interval: must be null or an integer >= 0",
        ),
        (
            {"prefix_cache_retention_interval": 6, "block_size": 4, "sliding_window": 8},
            "engine.prefix_cache_retention_interval: must be a multiple of block_size (4); got 6",
        ),
        (
            {"prefix_cache_retention_interval": 16, "block_size": 16},
            "engine.prefix_cache_retention_interval: > 0 needs a sliding window",
        ),
        ({"watermark": 1}, "engine.watermark: must be a number in [0, 1); got 1"),
        ({"watermark": True}, "engine.watermark: must be a number in [0, 1); got True"),
        ({"watermark": "0.1"}, "engine.watermark: must be a number in [0, 1)"),
        (
            {"max_cache_hit_length": -1},
            "engine.max_cache_hit_length: must be null or an integer >= 0",
        ),
        ({"hash_seed": 42}, "engine.hash_seed: must be a string or null; got 42"),
        ({"sliding_window": 0}, "engine.sliding_window: must be null or a positive integer; got 0"),
        ({"max_model_len": -1}, "engine.max_model_len: must be null or a positive integer"),
        ({"seed": -1}, "engine.seed: must be null or an integer >= 0"),
        (
            {"layer_types": ["full_attention", "mamba"]},
            "engine.layer_types: must be a non-empty list",
        ),
        ({"layer_types": []}, "engine.layer_types: must be a non-empty list"),
        (
            {"layer_types": ["sliding_attention"]},
            "engine.layer_types: sliding_attention layers need engine.sliding_window",
        ),
        ({"blocksize": 4}, "engine.blocksize: unknown setting (known: admission, block_size"),
    ],
)
def test_engine_mistakes(engine, expect):
    assert one_problem({"engine": engine}).startswith(expect)


def test_engine_must_be_an_object():
    assert one_problem({"engine": [1]}) == "engine: must be an object"


@pytest.mark.parametrize(
    "req, expect",
    [
        ({"prompt": "x"}, "requests[0].id: must be a non-empty string; got None"),
        ({"id": "", "prompt": "x"}, "requests[0].id: must be a non-empty string; got ''"),
        ({"id": "a"}, "requests[0]: give exactly one of prompt, prompt_token_ids or prompt_embeds"),
        (
            {"id": "a", "prompt": "x", "prompt_token_ids": [1]},
            "requests[0]: give exactly one of prompt, prompt_token_ids or prompt_embeds",
        ),
        ({"id": "a", "prompt": ""}, "requests[0].prompt: must be a non-empty string"),
        (
            {"id": "a", "prompt_token_ids": []},
            "requests[0].prompt_token_ids: must be a non-empty list",
        ),
        (
            {"id": "a", "prompt_token_ids": [1, -2]},
            "requests[0].prompt_token_ids: must be a non-empty list of token ids",
        ),
        (
            {"id": "a", "prompt_token_ids": [1.5]},
            "requests[0].prompt_token_ids: must be a non-empty list of token ids",
        ),
        (
            {"id": "a", "prompt": "x", "max_tokens": 0},
            "requests[0].max_tokens: must be an integer >= 1; got 0",
        ),
        (
            {"id": "a", "prompt": "x", "arrival_step": -1},
            "requests[0].arrival_step: must be an integer >= 0",
        ),
        (
            {"id": "a", "prompt": "x", "priority": "high"},
            "requests[0].priority: must be an integer; got 'high'",
        ),
        ({"id": "a", "prompt": "x", "chat": 1}, "requests[0].chat: must be true or false"),
        (
            {"id": "a", "prompt": "x", "ignore_eos": "no"},
            "requests[0].ignore_eos: must be true or false",
        ),
        (
            {"id": "a", "prompt": "x", "cache_salt": 7},
            "requests[0].cache_salt: must be a string or null",
        ),
        ({"id": "a", "prompt": "x", "maxtokens": 3}, "requests[0].maxtokens: unknown field"),
    ],
)
def test_request_mistakes(req, expect):
    assert one_problem({"requests": [req]}).startswith(expect)


def test_request_paths_count_from_zero_and_duplicates_are_named():
    ps = problems(
        {
            "requests": [
                {"id": "a", "prompt": "x"},
                5,
                {"id": "a", "prompt": "y"},
                {"id": "b", "prompt": "z", "max_tokens": "many"},
            ]
        }
    )
    assert ps == [
        "requests[1]: must be an object",
        "requests[2].id: duplicate id 'a'",
        "requests[3].max_tokens: must be an integer >= 1; got 'many'",
    ]


@pytest.mark.parametrize(
    "source, expect",
    [
        ({"requests": {}}, "requests: must be a list"),
        ({"model": "gpt2"}, "model: must be one of smollm2, tiny-random, tiny-hybrid; got 'gpt2'"),
        ({"device": "tpu"}, "device: must be one of auto, cpu, cuda; got 'tpu'"),
        ({"dtype": "int8"}, "dtype: must be one of float32, bfloat16, float16; got 'int8'"),
        ({"name": 3}, "name: must be a string"),
        (
            {"reqests": []},
            "reqests: unknown field (known: description, "
            "device, dtype, engine, model, name, requests)",
        ),
        ("[1, 2]", "(top level): must be a JSON object"),
        ('{"engine": {', "json: line 1 column 13:"),
    ],
)
def test_top_level_mistakes(source, expect):
    assert one_problem(source).startswith(expect)


def test_unreadable_file(tmp_path):
    assert one_problem(tmp_path / "missing.json").startswith("file: cannot read")


def test_all_problems_are_reported_at_once_and_nothing_is_half_applied():
    ps = problems(
        {
            "model": "x",
            "engine": {"block_size": 0, "num_gpu_blocks": 1},
            "requests": [{"id": "a", "prompt": "p", "max_tokens": 0}],
        }
    )
    assert [p.split(":")[0] for p in ps] == [
        "model",
        "engine.block_size",
        "engine.num_gpu_blocks",
        "requests[0].max_tokens",
    ]


def test_engine_overrides_from_key_value_pairs_are_validated_like_a_file():
    from paged_kv_lab.run.scenario import parse_engine_overrides, with_engine_overrides

    s = load_scenario({"engine": {"sliding_window": 8, "block_size": 4}})
    o = with_engine_overrides(
        s,
        parse_engine_overrides(
            [
                "watermark=0.1",
                "prefix_cache_retention_interval=null",
                "hash_algo=sha256_cbor",
                "hash_seed=0",
                "max_cache_hit_length=16",
            ]
        ),
    ).engine
    assert (
        o.watermark,
        o.prefix_cache_retention_interval,
        o.hash_algo,
        o.hash_seed,
        o.max_cache_hit_length,
    ) == (0.1, None, "sha256_cbor", "0", 16)
    with pytest.raises(ScenarioError) as info:
        with_engine_overrides(s, parse_engine_overrides(["watermark=2", "blk=3"]))
    assert [p.split(":")[0] for p in info.value.problems] == ["engine.watermark", "engine.blk"]
    with pytest.raises(ScenarioError, match="KEY=VALUE"):
        parse_engine_overrides(["watermark"])


def test_cli_set_overrides_an_engine_setting(tmp_path, capsys):
    from paged_kv_lab.cli.main import main

    f = tmp_path / "s.json"
    f.write_text(
        json.dumps(
            {
                "model": "tiny-random",
                "device": "cpu",
                "engine": {"block_size": 4, "num_gpu_blocks": 16, "hash_algo": "sha256"},
                "requests": [{"id": "a", "prompt_token_ids": [1, 2, 3, 4, 5], "max_tokens": 2}],
            }
        )
    )
    assert main(["run", str(f), "--set", "watermark=2", "--quiet"]) == 2
    assert "engine.watermark: must be a number in [0, 1); got 2" in capsys.readouterr().err
    trace = tmp_path / "t.jsonl"
    assert (
        main(
            [
                "run",
                str(f),
                "--set",
                "hash_algo=sha256_cbor",
                "--set",
                "hash_seed=0",
                "--quiet",
                "--trace",
                str(trace),
            ]
        )
        == 0
    )
    engine = json.loads(trace.read_text().splitlines()[0])["scenario"]["engine"]
    assert (engine["hash_algo"], engine["hash_seed"]) == ("sha256_cbor", "0")


def test_enable_extensible_kv_cache_is_refused_where_vllm_refuses_it():
    """vLLM 0.34's extensible KV cache sizes the pool from measured memory: stated true beside a
    stated num_gpu_blocks (vLLM's num_gpu_blocks_override) or kv_cache_memory_bytes is refused,
    as ``VllmConfig._resolve_extensible_kv_cache`` refuses it; null (the default) and false pass,
    and the file format leaves the default out."""
    for stated in ({"num_gpu_blocks": 64}, {"kv_cache_memory_bytes": 1 << 20}, {}):
        p = one_problem({"engine": {"enable_extensible_kv_cache": True, **stated}})
        assert "enable_extensible_kv_cache true" in p and "measured after warm-up" in p
    on = load_scenario({"engine": {"enable_extensible_kv_cache": True, "num_gpu_blocks": "auto"}})
    assert on.engine.enable_extensible_kv_cache is True
    assert load_scenario({}).engine.enable_extensible_kv_cache is None
    assert "enable_extensible_kv_cache" not in scenario_to_dict(load_scenario({}))["engine"]
    off = {"engine": {"enable_extensible_kv_cache": False, "num_gpu_blocks": 64}}
    assert load_scenario(off).engine.enable_extensible_kv_cache is False
    assert "null, true or false" in one_problem({"engine": {"enable_extensible_kv_cache": 1}})


def test_gpu_memory_utilization_may_be_left_to_vllms_resolution():
    """null is vLLM 0.34's default, and the lab's (1.0 with the extensible KV cache, 0.92
    without)."""
    assert load_scenario({}).engine.gpu_memory_utilization is None  # vLLM 0.34's default
    unset = load_scenario({"engine": {"gpu_memory_utilization": None, "num_gpu_blocks": "auto"}})
    assert unset.engine.gpu_memory_utilization is None
    assert scenario_to_dict(unset)["engine"]["gpu_memory_utilization"] is None
    p = one_problem({"engine": {"gpu_memory_utilization": 1.5}})
    assert "null or a number in (0, 1]" in p
