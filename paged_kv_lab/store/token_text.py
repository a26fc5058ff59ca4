"""Token ids -> text, remembered once per loaded model and shared by every session and run
(figures and sentences decode the same few blocks over and over). No Streamlit here."""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any, Callable, Optional


class Decoder:
    """Token ids -> text through a model's tokenizer, remembered in a bounded LRU shared by all
    sessions. Invariant: at most ``max_entries`` entries; the map is only touched under the lock."""

    def __init__(self, decode: Callable[[list[int]], str], max_entries: int = 20_000) -> None:
        self._decode = decode
        self._cache: OrderedDict[tuple[int, ...], str] = OrderedDict()
        self._lock = threading.Lock()
        self.max_entries = max_entries

    def __call__(self, ids) -> str:
        key = tuple(int(i) for i in ids)
        with self._lock:
            text = self._cache.get(key)
            if text is not None:
                self._cache.move_to_end(key)
                return text
        text = self._decode(list(key))
        with self._lock:
            self._cache[key] = text
            while len(self._cache) > self.max_entries:
                self._cache.popitem(last=False)
        return text

    def __len__(self) -> int:
        return len(self._cache)


_DECODERS: dict[int, tuple[Any, Decoder]] = {}  # id(model) -> (weak ref to the model, its Decoder)
_DECODERS_LOCK = threading.Lock()


def decoder_for(model) -> Optional[Decoder]:
    """The shared Decoder of a loaded model (None without a model)."""
    if model is None or getattr(model, "tokenizer", None) is None:
        return None
    with _DECODERS_LOCK:
        entry = _DECODERS.get(id(model))
        if entry is None or entry[0]() is not model:
            for k in [k for k, (ref, _) in _DECODERS.items() if ref() is None]:
                del _DECODERS[k]  # models that are gone
            entry = _DECODERS[id(model)] = (weakref.ref(model), Decoder(model.decode))
        return entry[1]
