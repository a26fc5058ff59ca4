"""Integer helpers (vLLM: vllm/utils/math_utils.py)."""


def cdiv(a: int, b: int) -> int:
    """Ceiling division: the number of size-``b`` pieces that hold ``a`` items."""
    return -(-a // b)
