"""The WSGI application, for gunicorn: ``gunicorn --preload djproject.wsgi``."""

import os

from django.core.wsgi import get_wsgi_application
from django.urls import get_resolver

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "djproject.settings")
application = get_wsgi_application()
# Load the views (and the queue) now: with --preload, once, before the workers fork.
get_resolver().url_patterns  # noqa: B018
