"""Replicas of the engine behind a router: round robin ... KV-aware, fed by KV events."""
