"""``python -m bench``: the whole benchmark suite (see bench/run.py and bench/README.md).

``python -m bench compare A [B]`` compares two revisions instead (bench/compare.py); it is
dispatched before the suite is imported, since it needs no sqlqueue in this interpreter.
"""

import sys

if sys.argv[1:2] == ["compare"]:
    from bench.compare import main as compare

    raise SystemExit(compare(sys.argv[2:]))

from bench.run import main

raise SystemExit(main())
