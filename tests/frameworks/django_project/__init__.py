"""A small Django project (a shop whose orders ship in a job), run as Django runs it:
``manage.py`` from this directory, with its database in ``SHOP_DATABASE_URL``."""
