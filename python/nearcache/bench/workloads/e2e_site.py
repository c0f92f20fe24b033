"""The small Django site the ``e2e`` workload serves with gunicorn.

One module is the settings, the URL configuration and the WSGI
application (``gunicorn nearcache.bench.workloads.e2e_site:application``).
The bench passes its configuration in environment variables:

``NEARCACHE_E2E_CACHES``
    ``CACHES`` as JSON (the backend under test, configured as a new user
    would: its defaults).
``NEARCACHE_E2E_LOG_DIR``
    A directory where each worker process appends one line per computation
    (``f<id>`` for a fragment, ``p<id>`` for a page) to ``computes-<pid>``,
    so the bench counts computations, duplicates included, after the fact.
``NEARCACHE_E2E_PAGE_DECORATOR``
    ``django`` (Django's ``cache_page``) or ``nearcache``
    (``nearcache.contrib.django.cache_page``, stampede-free).

Views:

``/nowork/``
    Returns a short constant: the ceiling of the server and load generator.
``/fragments/<seed>/`` and ``/fragments/block/<block>/``
    Assemble 10 fragments of about 1.6 KB from a pool of
    :data:`FRAGMENTS`, each through ``cache.get_or_set`` (a miss renders it:
    :data:`FRAGMENT_ROUNDS` rounds of SHA-256, about 0.2 ms of CPU on the
    development machine); ``seed`` picks 10 fragments at random,
    ``block`` the ten fragments ``10*block .. 10*block+9`` (warm-up).
``/page/<n>/``
    A page of about 4 KB that takes :data:`PAGE_ROUNDS` rounds of SHA-256
    (about 2 ms) to render, under ``cache_page(60)``.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import threading
from typing import Any, Final

from django.core.cache import cache  # type: ignore[import-untyped]
from django.http import HttpRequest, HttpResponse  # type: ignore[import-untyped]
from django.urls import path  # type: ignore[import-untyped]

#: Fragments in the pool.
FRAGMENTS: Final = 2_000
#: Fragments per request of the fragments view.
PER_REQUEST: Final = 10
#: Distinct pages of the page view.
PAGES: Final = 500
#: SHA-256 rounds per fragment (about 0.2 ms) and per page (about 2 ms).
FRAGMENT_ROUNDS: Final = 400
PAGE_ROUNDS: Final = 4_000

# ------------------------------------------------------------------- settings

SECRET_KEY = "nearcache-e2e-bench-only"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
ROOT_URLCONF = __name__
USE_TZ = True
INSTALLED_APPS: list[str] = []
MIDDLEWARE: list[str] = []
DATABASES: dict[str, Any] = {}
CACHES = json.loads(
    os.environ.get(
        "NEARCACHE_E2E_CACHES",
        '{"default": {"BACKEND": "django.core.cache.backends.dummy.DummyCache"}}',
    )
)
if any(c.get("BACKEND", "").endswith("DatabaseCache") for c in CACHES.values()):
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ["NEARCACHE_E2E_SQLITE"],
            "OPTIONS": {"timeout": 20},
        }
    }
LOGGING_CONFIG = None

_LOG_DIR = os.environ.get("NEARCACHE_E2E_LOG_DIR", "")
_log: dict[int, Any] = {}
_log_lock = threading.Lock()


def _computed(what: str) -> None:
    """Append one line per computation to this process's log (unbuffered)."""
    if not _LOG_DIR:
        return
    pid = os.getpid()
    with _log_lock:
        fd = _log.get(pid)
        if fd is None:
            fd = _log[pid] = os.open(
                os.path.join(_LOG_DIR, f"computes-{pid}"),
                os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                0o666,
            )
        os.write(fd, f"{what}\n".encode())


def _work(seed: str, rounds: int) -> bytes:
    digest = seed.encode()
    for _ in range(rounds):
        digest = hashlib.sha256(digest).digest()
    return digest


def render_fragment(fid: int) -> str:
    """About 1.6 KB of HTML, computed with about 0.2 ms of CPU."""
    _computed(f"f{fid}")
    digest = _work(f"fragment-{fid}", FRAGMENT_ROUNDS).hex()
    return f'<div class="fragment" id="f{fid}">' + digest * 25 + "</div>"


def _fragments(ids: list[int]) -> HttpResponse:
    parts = [
        cache.get_or_set(f"fragment:{fid}", lambda fid=fid: render_fragment(fid)) for fid in ids
    ]
    return HttpResponse("<html><body>" + "".join(parts) + "</body></html>")


def fragments(request: HttpRequest, seed: int) -> HttpResponse:
    """Ten fragments picked at random (by ``seed``) from the pool."""
    return _fragments(random.Random(seed).sample(range(FRAGMENTS), PER_REQUEST))


def fragment_block(request: HttpRequest, block: int) -> HttpResponse:
    """Fragments ``10*block`` to ``10*block+9``: the warm-up walks every block."""
    first = (block * PER_REQUEST) % FRAGMENTS
    return _fragments(list(range(first, first + PER_REQUEST)))


def _page(request: HttpRequest, n: int) -> HttpResponse:
    _computed(f"p{n}")
    digest = _work(f"page-{n}", PAGE_ROUNDS).hex()
    return HttpResponse(f"<html><body><h1>page {n}</h1>" + digest * 64 + "</body></html>")


def nowork(request: HttpRequest) -> HttpResponse:
    """The ceiling: no cache, no work."""
    return HttpResponse("ok")


def _page_view() -> Any:
    if os.environ.get("NEARCACHE_E2E_PAGE_DECORATOR", "django") == "nearcache":
        from nearcache.contrib import django as nearcache_django

        return nearcache_django.cache_page(60)(_page)
    from django.views.decorators import cache as django_cache  # type: ignore[import-untyped]

    return django_cache.cache_page(60)(_page)


def _urlpatterns() -> list[Any]:
    return [
        path("nowork/", nowork),
        path("fragments/<int:seed>/", fragments),
        path("fragments/block/<int:block>/", fragment_block),
        path("page/<int:n>/", _page_view()),
    ]


def _application() -> Any:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", __name__)
    from django.core.wsgi import get_wsgi_application  # type: ignore[import-untyped]

    return get_wsgi_application()


_lazy: dict[str, Any] = {}


def __getattr__(name: str) -> Any:
    """``urlpatterns`` and ``application``, built on first use.

    Importing this module for its constants (the bench does) neither reads
    Django's settings nor sets them up; gunicorn's ``e2e_site:application``
    and Django's URL resolver reach these through this function.
    """
    builders = {"urlpatterns": _urlpatterns, "application": _application}
    if name not in builders:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _lazy:
        _lazy[name] = builders[name]()
    return _lazy[name]
