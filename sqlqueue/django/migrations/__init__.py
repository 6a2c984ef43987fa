"""sqlqueue's Django migrations: each runs sqlqueue's own revisions (see ``_tables.py``)."""
