"""vLLM's NIXL connector for disaggregated prefill (vLLM:
distributed/kv_transfer/kv_connector/v1/nixl/): connector.py holds the class and the flow."""
