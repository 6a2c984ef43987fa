"""sqlqueue's ``manage.py`` commands."""
