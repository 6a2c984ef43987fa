"""A Django project whose own tests use sqlqueue, run by Django's test runner
(tests/frameworks/test_django_test_runner.py copies it and runs ``manage.py test``)."""
