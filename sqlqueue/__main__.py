"""``python -m sqlqueue`` runs the command line."""

import sys

from sqlqueue.cli import main

sys.exit(main())
