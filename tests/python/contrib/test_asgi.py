"""CacheMiddleware: responses served from an AsyncCache, in a Starlette app."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from nearcache.aio import AsyncCache
from nearcache.contrib.asgi import CacheMiddleware

starlette = pytest.importorskip("starlette")
httpx = pytest.importorskip("httpx")
from starlette.applications import Starlette  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402


@pytest.fixture
def cache(tmp_path: Path) -> Iterator[AsyncCache]:
    opened = AsyncCache(path=tmp_path / "responses", size="4MiB")
    yield opened
    opened.driver.close()


def make_app(cache: AsyncCache, **options: Any) -> tuple[Any, dict[str, int], CacheMiddleware]:
    calls: dict[str, int] = {}

    def count(name: str) -> int:
        calls[name] = calls.get(name, 0) + 1
        return calls[name]

    async def item(request: Request) -> JSONResponse:
        n = count("item")
        return JSONResponse({"id": request.path_params["id"], "call": n})

    async def private(request: Request) -> PlainTextResponse:
        response = PlainTextResponse(str(count("private")))
        response.set_cookie("session", "abc")
        return response

    async def no_store(request: Request) -> PlainTextResponse:
        return PlainTextResponse(str(count("no-store")), headers={"Cache-Control": "no-store"})

    async def missing(request: Request) -> PlainTextResponse:
        return PlainTextResponse(str(count("missing")), status_code=404)

    async def big(request: Request) -> PlainTextResponse:
        return PlainTextResponse(str(count("big")) + "x" * 5000)

    async def stream(request: Request) -> StreamingResponse:
        n = count("stream")

        async def parts() -> AsyncIterator[bytes]:
            for part in (b"one,", b"two,", str(n).encode()):
                yield part

        return StreamingResponse(parts(), media_type="text/plain")

    async def create(request: Request) -> PlainTextResponse:
        return PlainTextResponse(str(count("post")))

    app = Starlette(
        routes=[
            Route("/item/{id}", item),
            Route("/private", private),
            Route("/no-store", no_store),
            Route("/missing", missing),
            Route("/big", big),
            Route("/stream", stream),
            Route("/create", create, methods=["POST"]),
        ]
    )
    middleware = CacheMiddleware(app, cache=cache, **options)
    return middleware, calls, middleware


def run(app: Any, requests: list[tuple[str, str, dict[str, str]]]) -> list[Any]:
    async def main() -> list[Any]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return [
                await client.request(method, url, headers=headers)
                for method, url, headers in requests
            ]

    return asyncio.run(main())


def test_repeated_gets_are_served_from_the_cache(cache: AsyncCache) -> None:
    app, calls, middleware = make_app(cache, ttl=60)
    first, second, other = run(
        app, [("GET", "/item/1", {}), ("GET", "/item/1", {}), ("GET", "/item/2", {})]
    )
    assert first.json() == second.json() == {"id": "1", "call": 1}
    assert first.headers["x-cache"] == "MISS" and second.headers["x-cache"] == "HIT"
    assert second.headers["content-type"] == "application/json"
    assert "age" in second.headers
    assert other.json() == {"id": "2", "call": 2}
    assert calls == {"item": 2}
    assert (middleware.hits, middleware.misses) == (1, 2)


def test_what_is_never_cached(cache: AsyncCache) -> None:
    app, calls, _ = make_app(cache, ttl=60, max_body=1000)
    paths = ["/private", "/no-store", "/missing", "/big"]
    responses = run(app, [("GET", path, {}) for path in paths for _ in range(2)])
    assert all(r.headers.get("x-cache") != "HIT" for r in responses)
    assert calls == {"private": 2, "no-store": 2, "missing": 2, "big": 2}
    run(app, [("POST", "/create", {}), ("POST", "/create", {})])
    run(app, [("GET", "/item/9", {"Authorization": "Bearer x"})] * 2)
    run(app, [("GET", "/item/9", {"Cookie": "a=b"})] * 2)
    assert calls["post"] == 2 and calls["item"] == 4


def test_request_cache_control(cache: AsyncCache) -> None:
    app, calls, _ = make_app(cache, ttl=60)
    responses = run(
        app,
        [
            ("GET", "/item/1", {}),
            ("GET", "/item/1", {"Cache-Control": "no-cache"}),  # refreshes the copy
            ("GET", "/item/1", {}),
            ("GET", "/item/1", {"Cache-Control": "no-store"}),  # bypasses it
        ],
    )
    assert [r.json()["call"] for r in responses] == [1, 2, 2, 3]
    assert calls == {"item": 3}


def test_vary_headers_get_their_own_copies(cache: AsyncCache) -> None:
    app, calls, _ = make_app(cache, ttl=60)
    run(
        app,
        [
            ("GET", "/item/1", {"Accept": "application/json"}),
            ("GET", "/item/1", {"Accept": "text/html"}),
            ("GET", "/item/1", {"Accept": "application/json"}),
            ("GET", "/item/1?x=1", {"Accept": "application/json"}),
        ],
    )
    assert calls == {"item": 3}


def test_streamed_responses_are_stored_whole(cache: AsyncCache) -> None:
    app, calls, _ = make_app(cache, ttl=60)
    first, second = run(app, [("GET", "/stream", {}), ("GET", "/stream", {})])
    assert first.text == second.text == "one,two,1"
    assert second.headers["x-cache"] == "HIT"
    assert calls == {"stream": 1}


def test_ttl_and_tags(cache: AsyncCache) -> None:
    app, calls, _ = make_app(cache, ttl=0.2, tags=lambda scope: ["items"])
    run(app, [("GET", "/item/1", {}), ("GET", "/item/1", {})])
    assert calls == {"item": 1}
    asyncio.run(cache.invalidate_tags(["items"]))
    run(app, [("GET", "/item/1", {})])
    assert calls == {"item": 2}
    asyncio.run(asyncio.sleep(0.3))
    run(app, [("GET", "/item/1", {})])
    assert calls == {"item": 3}


def test_concurrent_misses_call_the_app_once(cache: AsyncCache) -> None:
    calls = 0

    async def slow(request: Request) -> PlainTextResponse:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.1)
        return PlainTextResponse(f"call {calls}")

    async def private(request: Request) -> PlainTextResponse:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.05)
        response = PlainTextResponse("mine")
        response.set_cookie("s", "1")
        return response

    app = CacheMiddleware(
        Starlette(routes=[Route("/slow", slow), Route("/private", private)]), cache=cache
    )

    async def main(path: str) -> list[Any]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await asyncio.gather(*(client.get(path) for _ in range(8)))

    responses = asyncio.run(main("/slow"))
    assert [r.text for r in responses] == ["call 1"] * 8
    assert calls == 1
    assert sorted(r.headers["x-cache"] for r in responses) == ["HIT"] * 7 + ["MISS"]
    # An uncacheable response: the waiters ask the app themselves.
    responses = asyncio.run(main("/private"))
    assert [r.text for r in responses] == ["mine"] * 8
    assert calls == 9


def test_add_middleware_recipe(cache: AsyncCache) -> None:
    """The documented form: ``app.add_middleware(CacheMiddleware, cache=..., ...)``."""
    calls = 0

    async def catalog(request: Request) -> JSONResponse:
        nonlocal calls
        calls += 1
        return JSONResponse({"items": calls})

    app = Starlette(routes=[Route("/catalog", catalog)])
    app.add_middleware(
        CacheMiddleware,
        cache=cache,
        ttl=30,
        tags=lambda scope: ["catalog"] if scope["path"].startswith("/catalog") else [],
    )
    first, second = run(app, [("GET", "/catalog", {}), ("GET", "/catalog", {})])
    assert first.json() == second.json() == {"items": 1}
    asyncio.run(cache.invalidate_tags(["catalog"]))
    (third,) = run(app, [("GET", "/catalog", {})])
    assert third.json() == {"items": 2}
