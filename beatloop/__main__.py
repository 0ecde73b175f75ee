"""``python -m beatloop``: the same command as the ``beatloop`` console script."""

import sys

from beatloop.cli import main

sys.exit(main())
