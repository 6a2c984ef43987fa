"""The project's settings, URLs and WSGI application."""
