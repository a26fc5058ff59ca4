"""The page tests (AppTest, in this process) run the app on the tiny model on the CPU, without
the server's warm-up: every module here uses tests/conftest.py's ``tiny_model_env``."""

import pytest


@pytest.fixture(scope="module", autouse=True)
def app_on_the_tiny_model(tiny_model_env):
    yield
