"""Python-side charts that span steps (usage and hit rate over time, token budget, blocks held):
pure functions of recorded Snapshots / StepRecords -> plotly Figure. The per-step pictures are
drawn in the browser by the step player (player/)."""
from .charts import blocks_held, metrics_over_time, token_budget

__all__ = ["blocks_held", "metrics_over_time", "token_budget"]
