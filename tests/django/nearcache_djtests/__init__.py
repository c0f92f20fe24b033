"""Django's own cache test suite, pointed at nearcache's Django backends.

This package is put on ``sys.path`` beside Django's ``tests/`` directory (taken
from the Django source distribution by ``tests/django/run.py``) and run with
Django's ``runtests.py``:

- :mod:`.settings` extends Django's ``test_sqlite`` settings with a recording
  test runner;
- :mod:`.runner` records every test outcome to a JSON file for the summary;
- :mod:`.tests` subclasses Django's ``BaseCacheTests`` for each nearcache
  backend, the way Django's own backend test classes do.
"""
