"""Stop strings (vLLM: v1/engine/detokenizer.py). vLLM's scheduler knows nothing of them: the
output processor detokenizes each step's new tokens, looks for a stop string in the new text, and
on a match truncates the text, drops the tokens after the one completing it, and has the engine
core finish the request (``EngineCore.abort_requests``: the scheduler frees it as
FINISHED_ABORTED, the client sees finish reason "stop" with the string as its stop_reason)."""

from __future__ import annotations

import sys
from bisect import bisect_left
from typing import Callable, Optional, Sequence

Decode = Callable[[Sequence[int]], str]


def check_stop_strings(
    output_text: str, new_char_count: int, stop: Sequence[str], include_in_output: bool
) -> Optional[tuple[str, int]]:
    """(the stop string found in the last ``new_char_count`` characters, the length to cut the
    text to, or -1 to keep it whole); None if none is there. Of several, the one that ends
    first wins (as if the tokens came one by one), ties going to the earlier in ``stop``."""
    if not new_char_count or not stop:
        return None
    found, found_at, found_end = None, 0, sys.maxsize
    for s in stop:
        # a match must end inside the new text: start the search len(s) - 1 characters before it
        at = output_text.find(s, 1 - new_char_count - len(s))
        if at != -1 and at + len(s) < found_end:
            found, found_at, found_end = s, at, at + len(s)
    if found is None:
        return None
    if not include_in_output:
        return found, found_at
    return found, (-1 if found_end >= len(output_text) else found_end)


class IncrementalDetokenizer:
    """One request's output text, grown step by step, checked for its stop strings.

    Invariant: ``output_text`` is the text of ``token_ids`` (cut at the stop string once one
    matched); a token whose bytes do not yet complete a character adds no text until they do.
    """

    def __init__(
        self, decode: Decode, stop: Sequence[str], include_stop_str_in_output: bool = False
    ) -> None:
        self.decode = decode
        self.stop = list(stop)
        self.include_stop_str_in_output = include_stop_str_in_output
        self.token_ids: list[int] = []
        self.output_text = ""
        self.stop_reason: Optional[str] = None

    def _text_after(self, token_ids: Sequence[int]) -> str:
        """The text once ``token_ids`` are decoded: a trailing incomplete character (decoded as
        U+FFFD) waits for the next token, as vLLM's incremental DecodeStream does."""
        text = self.decode(token_ids)
        if text.endswith("\ufffd") or not text.startswith(self.output_text):
            return self.output_text
        return text

    def update(self, new_token_ids: Sequence[int], stop_terminated: bool) -> Optional[str]:
        """Add one step's tokens; the stop string matched, or None. ``stop_terminated``: the
        last token finished the request (EOS or a stop token) and, unless stop strings are kept
        in the output, adds no text."""
        if not new_token_ids:
            return None
        texted = list(new_token_ids)
        if stop_terminated and not self.include_stop_str_in_output:
            texted = texted[:-1]
        first_new = len(self.token_ids)
        offsets = [len(self.output_text)]  # the text's length after each new token
        for token in texted:
            self.token_ids.append(token)
            self.output_text = self._text_after(self.token_ids)
            offsets.append(len(self.output_text))
        if len(texted) < len(new_token_ids):
            self.token_ids.append(new_token_ids[-1])
            offsets.append(len(self.output_text))
        hit = check_stop_strings(
            self.output_text,
            len(self.output_text) - offsets[0],
            self.stop,
            self.include_stop_str_in_output,
        )
        if hit is None:
            return None
        self.stop_reason, cut = hit
        end = len(self.output_text) if cut == -1 else cut
        if not self.include_stop_str_in_output:
            end += len(self.stop_reason)
        # the tokens after the one that completed the stop string are dropped
        del self.token_ids[first_new + bisect_left(offsets, end, lo=1) :]
        if cut != -1:
            self.output_text = self.output_text[:cut]
        return self.stop_reason
