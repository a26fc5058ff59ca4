"""Settings of the KV-event publisher (vLLM: vllm/config/kv_events.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class KVEventsConfig:
    """vLLM's --kv-events-config, the fields our publisher uses (same names and defaults).

    Also the scenario's ``engine.kv_events`` (validated there by pydantic, strictly)."""

    __pydantic_config__ = {"extra": "forbid"}
    enable_kv_cache_events: bool = False
    publisher: Optional[str] = None  # "zmq" when enabled, else "null"
    endpoint: str = "tcp://*:5557"
    replay_endpoint: Optional[str] = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""
    # Not part of vLLM's KVEventsConfig: vLLM reads it from the environment variable
    # VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES (default 1). False publishes all 32 bytes.
    use_int_block_hashes: bool = True

    def __post_init__(self) -> None:
        if self.publisher is None:
            object.__setattr__(self, "publisher", "zmq" if self.enable_kv_cache_events else "null")
        if self.publisher not in ("zmq", "null"):
            raise ValueError(
                f"kv_events.publisher: must be 'zmq' or 'null'; got {self.publisher!r}"
            )
        for name in ("enable_kv_cache_events", "use_int_block_hashes"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(
                    f"kv_events.{name}: must be true or false; got {getattr(self, name)!r}"
                )
        if not isinstance(self.topic, str):
            raise ValueError(f"kv_events.topic: must be a string; got {self.topic!r}")
        for name in ("buffer_steps", "hwm", "max_queue_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"kv_events.{name}: must be a positive integer; got {v!r}")
        for name in ("endpoint", "replay_endpoint"):
            v = getattr(self, name)
            if v is not None and not (
                isinstance(v, str) and v.startswith(("tcp://", "ipc://", "inproc://"))
            ):
                raise ValueError(
                    f"kv_events.{name}: must be a tcp://, ipc:// or inproc:// endpoint; got {v!r}"
                )
