"""Paged KV Lab: everything of the lab that is not vLLM's mirror (kvcore)."""
