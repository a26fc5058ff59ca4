"""``paged-kv-lab``: start the app, wherever the package is installed.

    paged-kv-lab [STREAMLIT RUN OPTIONS ...]      e.g. paged-kv-lab --server.port 8502

It is ``python -m streamlit run <this package>/streamlit_app.py`` with the arguments passed
through: the content (``content/``: the page registry and the lesson folders) and the app's
Streamlit settings (``.streamlit/config.toml``, read as the main script's own config) sit beside
that file, so the app is the same from a checkout, an editable install or a wheel, and from any
working directory. The command line is
``python -m paged_kv_lab`` (also installed as ``paged-kv-lab-cli``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

APP_SCRIPT = Path(__file__).resolve().parents[1] / "streamlit_app.py"


def streamlit_command(args: list[str]) -> list[str]:
    """The command that runs the app under this interpreter, ``args`` appended (they override the
    app's config: Streamlit's flags win over its config files)."""
    return [sys.executable, "-m", "streamlit", "run", str(APP_SCRIPT), *args]


def main(argv: list[str] | None = None) -> int:
    cmd = streamlit_command(sys.argv[1:] if argv is None else list(argv))
    if os.name == "posix":
        # replaced, not wrapped: a signal to this process (Ctrl-C, a service manager's SIGTERM)
        # reaches the server itself, and no parent is left waiting
        os.execv(cmd[0], cmd)
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main())
