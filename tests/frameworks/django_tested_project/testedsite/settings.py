"""Settings as a new project has them, on the database of ``SHOP_DATABASE_URL`` (a SQLAlchemy
URL, as the tests hand out) — the *development* database. No ``TEST`` entry: Django's test
runner makes its default test database (on SQLite, in memory)."""

import os
from typing import Any

from sqlalchemy import make_url

SECRET_KEY = "test-only-not-secret"
DEBUG = False
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "sqlqueue.django", "shop"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

_ENGINES = {
    "sqlite": "django.db.backends.sqlite3",
    "postgresql": "django.db.backends.postgresql",
    "mysql": "django.db.backends.mysql",
}


def _database(url_text: str) -> dict[str, Any]:
    url = make_url(url_text)
    backend = url.get_backend_name()
    options: dict[str, Any] = {}
    if backend == "mysql":
        # mysqlclient needs a C client library this machine lacks: PyMySQL stands in for it.
        import pymysql  # type: ignore[import-untyped]

        pymysql.install_as_MySQLdb()
        options = {"charset": "utf8mb4"}
    return {
        "ENGINE": _ENGINES[backend],
        "NAME": url.database,
        "USER": url.username or "",
        "PASSWORD": url.password or "",
        "HOST": url.host or "",
        "PORT": str(url.port or ""),
        "OPTIONS": options,
    }


DATABASES = {"default": _database(os.environ["SHOP_DATABASE_URL"])}
