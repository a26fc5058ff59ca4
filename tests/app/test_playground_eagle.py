"""The playground's speculative-decoding form offers the EAGLE/MTP head, and Apply keeps a
scenario's EAGLE settings (it turned an unknown method off before the head existed)."""

from paged_kv_lab.run.scenario import load_scenario
from paged_kv_lab.ui.playground import SPEC_METHODS, _speculative_value


def form(method, k=3, layers=0):
    return {"pg_spec_method": method, "pg_num_speculative_tokens": k, "pg_num_draft_layers": layers}


def test_eagle_and_mtp_are_offered_on_plain_hashes():
    assert {"eagle", "mtp"} <= set(SPEC_METHODS)
    for method in ("eagle", "mtp"):
        new = _speculative_value(form(method), {"method": "ngram", "num_speculative_tokens": 2})
        assert new["method"] == method and new["disable_lookahead_block_hashes"] is True
        assert new["num_draft_layers"] is None
        load_scenario({"engine": {"speculative": new}})  # a valid setting


def test_apply_keeps_the_scenarios_own_eagle_settings():
    old = {
        "method": "eagle",
        "num_speculative_tokens": 3,
        "disable_lookahead_block_hashes": True,
        "disable_eagle_block_drop": True,
    }
    assert _speculative_value(form("eagle"), old) == {**old, "num_draft_layers": None}
