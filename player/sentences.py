"""The one place the player reads event sentences from (kvcore's table, shared with the CLI)."""
from kvcore.sentences import changed_blocks, reason, step_sentences

__all__ = ["changed_blocks", "reason", "step_sentences"]
