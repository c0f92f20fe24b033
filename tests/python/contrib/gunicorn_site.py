"""A Django site for the deployment tests of ``test_django_gunicorn.py``.

Settings, URLs and WSGI application in one module, served by gunicorn with
``--pythonpath`` pointing here.  ``GUNICORN_SITE_CACHE`` is the NearCache
``LOCATION`` (a path); ``GUNICORN_SITE_TOUCH=1`` makes the module use the
cache when it is imported, so with ``--preload`` the cache is opened in
gunicorn's master before it forks the workers.

Views (all plain text):

``/whoami/``             ``<pid> <uid>`` of the worker
``/set/<key>/<value>/``  stores the value; answers the worker's pid
``/get/<key>/``          ``<value or -> <pid>``
``/hold-shard/<key>/``   writes the worker's pid to ``<GUNICORN_SITE_PIDS>/<key>``, then
                         holds the key's shard locked mid-write for 60 s (the
                         engine's test hook): the worker is meant to be killed there
``/slow/<key>/``         ``get_or_set`` whose computation writes the pid file and
                         sleeps 60 s, so the worker dies holding the stampede lock
``/compute/<key>/``      ``get_or_set`` with a quick computation: ``<value> <pid>``
``/stats/``              the cache's shard repairs (resets + salvages) and stampede counters
``/capacity/``           the cache file's size in bytes, and the worker's pid

``GUNICORN_SITE_SIZE`` is ``OPTIONS["size"]`` (default ``4MiB``): a deploy
that changes it resizes the cache live.
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gunicorn_site")

SECRET_KEY = "nearcache-deployment-tests"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1"]
ROOT_URLCONF = "gunicorn_site"
USE_TZ = True
INSTALLED_APPS: list[str] = []
MIDDLEWARE: list[str] = []
DATABASES: dict[str, object] = {}
LOGGING_CONFIG = None
CACHES = {
    "default": {
        "BACKEND": "nearcache.contrib.django.NearCache",
        "LOCATION": os.environ.get("GUNICORN_SITE_CACHE", "gunicorn-site"),
        "OPTIONS": {"size": os.environ.get("GUNICORN_SITE_SIZE", "4MiB"), "stampede_wait": 1},
    }
}

from django.core.cache import cache  # noqa: E402
from django.core.wsgi import get_wsgi_application  # noqa: E402
from django.http import HttpRequest, HttpResponse  # noqa: E402
from django.urls import path  # noqa: E402

PIDS = os.environ.get("GUNICORN_SITE_PIDS", "/tmp")


def _text(body: object) -> HttpResponse:
    return HttpResponse(str(body), content_type="text/plain")


def _mark(key: str) -> None:
    with open(os.path.join(PIDS, key), "w") as f:
        f.write(str(os.getpid()))


def whoami(request: HttpRequest) -> HttpResponse:
    return _text(f"{os.getpid()} {os.getuid()}")


def set_value(request: HttpRequest, key: str, value: str) -> HttpResponse:
    cache.set(key, value)
    return _text(os.getpid())


def get_value(request: HttpRequest, key: str) -> HttpResponse:
    return _text(f"{cache.get(key, '-')} {os.getpid()}")


def hold_shard(request: HttpRequest, key: str) -> HttpResponse:
    _mark(key)
    cache.cache.native._debug_hold_shard_mid_write(cache.make_key(key), 60.0)
    return _text("released")


def slow(request: HttpRequest, key: str) -> HttpResponse:
    def compute() -> str:
        _mark(key)
        time.sleep(60)
        return "slow"

    return _text(cache.get_or_set(key, compute, 300))


def compute(request: HttpRequest, key: str) -> HttpResponse:
    return _text(f"{cache.get_or_set(key, lambda: f'by-{os.getpid()}', 300)} {os.getpid()}")


def stats(request: HttpRequest) -> HttpResponse:
    s = cache.stats()
    repairs = s["resets"] + s["salvages"]  # a repair salvages or, failing that, resets
    return _text(f"{repairs} {s['get_or_set_computes']} {s['get_or_set_waits']}")


def capacity(request: HttpRequest) -> HttpResponse:
    return _text(f"{cache.cache.capacity} {os.getpid()}")


urlpatterns = [
    path("whoami/", whoami),
    path("set/<str:key>/<str:value>/", set_value),
    path("get/<str:key>/", get_value),
    path("hold-shard/<str:key>/", hold_shard),
    path("slow/<str:key>/", slow),
    path("compute/<str:key>/", compute),
    path("stats/", stats),
    path("capacity/", capacity),
]

application = get_wsgi_application()

if os.environ.get("GUNICORN_SITE_TOUCH") == "1":
    # With --preload this runs in the master, before the workers are forked.
    cache.set("preloaded-by", os.getpid())
