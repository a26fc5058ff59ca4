"""kvcore: a vLLM-v1-faithful paged KV-cache engine, recorded step by step.

Pure Python except kvcore.model (torch + transformers).
"""
from kvcore.scenario import EngineSettings, RequestSpec, Scenario, ScenarioError, load_scenario

__all__ = ["EngineSettings", "RequestSpec", "Scenario", "ScenarioError", "load_scenario"]
