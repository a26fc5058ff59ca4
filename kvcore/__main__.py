import sys

from paged_kv_lab.cli.main import main

sys.exit(main())
