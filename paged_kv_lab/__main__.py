"""``python -m paged_kv_lab``: the lab's command line (cli/main.py); also installed as
``paged-kv-lab-cli``."""

import sys

from paged_kv_lab.cli.main import main

sys.exit(main())
