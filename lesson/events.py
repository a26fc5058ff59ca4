"""Events as sentences: the app reads kvcore's one table (``kvcore.sentences``) through here."""
from kvcore.sentences import (ICONS, REASONS, SENTENCES, Decode, changed_blocks, ids, reason, sentence,
                              step_sentences)

__all__ = ["ICONS", "REASONS", "SENTENCES", "Decode", "changed_blocks", "ids", "reason", "sentence",
           "step_sentences"]
