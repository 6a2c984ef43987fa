"""``python -m bench``: the whole benchmark suite (see bench/run.py and bench/README.md)."""

from bench.run import main

raise SystemExit(main())
