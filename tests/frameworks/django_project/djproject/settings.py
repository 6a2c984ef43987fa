"""Settings: the database comes from ``SHOP_DATABASE_URL`` (a SQLAlchemy URL, as the tests
hand out), translated into Django's ``DATABASES``."""

import os
from typing import Any

from sqlalchemy import make_url

SECRET_KEY = "test-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
USE_TZ = True
ROOT_URLCONF = "djproject.urls"
INSTALLED_APPS = ["sqlqueue.django", "shop"]
MIDDLEWARE: list[str] = []
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGGING_CONFIG = None

_ENGINES = {
    "sqlite": "django.db.backends.sqlite3",
    "postgresql": "django.db.backends.postgresql",
    "mysql": "django.db.backends.mysql",
}


_PERSISTENT = os.environ.get("SHOP_PERSISTENT_CONNECTIONS") == "1"


def _database(url_text: str) -> dict[str, Any]:
    url = make_url(url_text)
    backend = url.get_backend_name()
    options: dict[str, Any] = {}
    if backend == "mysql":
        # mysqlclient needs a C client library this machine lacks: PyMySQL stands in for it.
        import pymysql  # type: ignore[import-untyped]

        pymysql.install_as_MySQLdb()
        options = {"charset": "utf8mb4"}
    if backend == "sqlite":
        # Writers wait for the lock from the start of the transaction instead of failing
        # when a read transaction turns into a write (Django >= 5.1).
        options = {"transaction_mode": "IMMEDIATE", "timeout": 30}
    return {
        "ENGINE": _ENGINES[backend],
        "NAME": url.database,
        "USER": url.username or "",
        "PASSWORD": url.password or "",
        "HOST": url.host or "",
        "PORT": str(url.port or ""),
        "OPTIONS": options,
        # Django's default, a connection per request (per job); SHOP_PERSISTENT_CONNECTIONS=1
        # keeps each thread's connection and checks it before reusing it after a request.
        "CONN_MAX_AGE": None if _PERSISTENT else 0,
        "CONN_HEALTH_CHECKS": _PERSISTENT,
    }


DATABASES = {"default": _database(os.environ["SHOP_DATABASE_URL"])}
