"""``python -m sqlqueue`` runs the command line."""

import sys

from sqlqueue._cli import main

sys.exit(main())
