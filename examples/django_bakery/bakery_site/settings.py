"""Settings: SQLite at ``BAKERY_DATABASE``; sqlqueue's Django app next to the bakery."""

import os

SECRET_KEY = "example-only"
DEBUG = True
USE_TZ = True
INSTALLED_APPS = ["sqlqueue.django", "bakery"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ["BAKERY_DATABASE"],
        # Writers take the lock when their transaction begins (Django >= 5.1).
        "OPTIONS": {"transaction_mode": "IMMEDIATE"},
    }
}
