"""Apps that worker processes serve (``sqlqueue worker tests.apps.<app>:queue``)."""

import tempfile
from pathlib import Path

#: The database an app's Queue is built on when it is imported by a test for its tasks only
#: (the workers get ``SQLQUEUE_DATABASE_URL``): a file that nothing opens, since an in-memory
#: SQLite database is refused.
UNOPENED_DATABASE = f"sqlite:///{Path(tempfile.gettempdir()) / 'sqlqueue-tests-unopened.db'}"
