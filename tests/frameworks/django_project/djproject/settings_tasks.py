"""The project's settings with Django's Tasks framework on sqlqueue's backend (the
``django-tasks`` backport, on this Django); its ``TASKS`` is the guide's."""

from .settings import *  # noqa: F403

TASKS = {
    "default": {
        "BACKEND": "sqlqueue.django.tasks.Backend",
        "QUEUES": ["default", "shipping"],
        "OPTIONS": {"DATABASE": "default", "MAX_ATTEMPTS": 1},
    }
}
