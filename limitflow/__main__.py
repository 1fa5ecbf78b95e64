"""``python -m limitflow``."""

import sys

from limitflow.cli import main

sys.exit(main())
