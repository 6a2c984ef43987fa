"""A Django project whose orders are baked by sqlqueue jobs, enqueued in Django's transaction.

Run the demo with one command (an SQLite file in a temporary directory; ``BAKERY_DATABASE``
names another file)::

    python examples/django_bakery/manage.py demo

It migrates sqlqueue's tables and the app's, places two orders in ``transaction.atomic()``
blocks (the second rolled back after its job was enqueued), then runs
``manage.py sqlqueue_worker bakery.jobs:queue --burst``, whose handler reads the order through
the ORM. The commands on their own::

    python examples/django_bakery/manage.py sqlqueue_migrate
    python examples/django_bakery/manage.py sqlqueue_worker bakery.jobs:queue --concurrency 4
"""

import os
import sys
import tempfile

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bakery_site.settings")
    os.environ.setdefault(
        "BAKERY_DATABASE", os.path.join(tempfile.mkdtemp(prefix="sqlqueue-django-"), "bakery.db")
    )
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
