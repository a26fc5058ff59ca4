import sys

from kvcore.cli import main

sys.exit(main())
