"""Disaggregated serving: a prefill replica and a decode replica of the engine (pd.py)."""
