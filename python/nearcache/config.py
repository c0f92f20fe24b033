"""Caches from configuration: a URL or a dict, as frameworks keep them in settings.

URLs
====

==========================================================  =====================================
URL                                                         cache
==========================================================  =====================================
``nearcache://myapp?size=64MiB&ttl=5m``                     this host's shared-memory cache
``nearcache:///var/cache/myapp.cache?size=1GiB``            ... at a path (three slashes)
``memory://?max_entries=10000&max_bytes=64MiB``             a bounded dict in this process
``redis://:password@host:6379/0?prefix=myapp:&timeout=0.5``  Redis (``rediss://`` TLS, ``unix://``)
``redis+cluster://host1:6379,host2:6379?prefix=myapp:``      Redis Cluster (seed nodes)
``redis+sentinel://host1:26379,host2:26379/mymaster/0``      Redis behind Sentinel (service, db)
``memcached://host1:11211,host2:11211?prefix=myapp:``        memcached (``memcached:///path.sock``)
``null://``                                                 no caching at all
==========================================================  =====================================

Two URLs, as a list or in one string separated by whitespace, make a
:class:`~nearcache.tiered.TieredCache` (the first is L1, the second L2)::

    from_url("nearcache://myapp?size=64MiB redis://cache-host:6379/0?prefix=myapp:")

Query parameters, common to every driver: ``ttl`` (default TTL: seconds or
``"5m"``), ``serializer`` (``pickle``, ``json``, ``msgpack``), and, except for
memory/null, ``compress`` and ``compress_threshold``.  Driver-specific ones:

* nearcache: ``size``, ``shards``, ``prefix``, ``signing_key``;
* memory: ``max_entries``, ``max_bytes``, ``max_value_size``;
* redis: ``prefix``, ``timeout`` (socket), ``connect_timeout``,
  ``max_connections``, ``retries``, ``health_check_interval``,
  ``signing_key``; any other parameter (``db``, ``ssl_cert_reqs``...) is
  left in the URL for redis-py;
* redis+cluster: as redis (``retries`` defaults to 1), plus ``password``,
  ``username``;
* redis+sentinel: as redis, plus ``password``, ``username`` (the data
  servers'), ``sentinel_password``, ``db`` (also the path's second part);
* memcached: ``prefix``, ``timeout``, ``connect_timeout``,
  ``max_pool_size``, ``max_value_size``, ``signing_key``;
* tiered (keyword arguments of :func:`from_url`, or keys of the dict):
  ``l1_ttl``, ``invalidation``, ``channel``, ``on_get_error``,
  ``on_set_error``, ``ready_timeout``, ``circuit_breaker``.

Unknown parameters raise :class:`~nearcache.errors.ConfigurationError`, so
a typo never passes silently.  Keyword arguments to :func:`from_url`
override the URL's parameters (and may be objects, such as a serializer).

Dicts
=====

::

    from_dict({"url": "redis://localhost:6379/0", "prefix": "myapp:"})
    from_dict({"driver": "memory", "max_entries": 1000})
    from_dict({
        "l1": {"driver": "nearcache", "name": "myapp", "size": "64MiB"},
        "l2": "redis://cache-host:6379/0?prefix=myapp:",
        "l1_ttl": 30,
        "on_get_error": "log",
    })

``driver`` is one of ``nearcache`` (or ``shm``), ``memory``, ``redis``,
``memcached``, ``null``, ``tiered``; the other keys are the driver's keyword
arguments (``ttl`` may stand for ``default_ttl``).  ``l1`` and ``l2`` imply
``tiered`` and are themselves URLs or dicts.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from nearcache.drivers.base import Driver
from nearcache.errors import ConfigurationError
from nearcache.units import parse_duration, parse_size

__all__ = ["from_dict", "from_url"]

_TIERED_OPTIONS = frozenset(
    {
        "l1_ttl",
        "invalidation",
        "channel",
        "on_get_error",
        "on_set_error",
        "ready_timeout",
        "circuit_breaker",
    }
)


def _to_int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError("a bool is not a number")
    return int(value)


def _to_float(value: Any) -> float:
    return parse_duration(value)


def _to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {value!r}")


def _to_size(value: Any) -> int:
    return parse_size(value if isinstance(value, int) else str(value))


def _to_optional_size(value: Any) -> int | None:
    if value is None or (isinstance(value, str) and value.lower() in ("", "none")):
        return None
    return _to_size(value)


def _to_optional_int(value: Any) -> int | None:
    if value is None or (isinstance(value, str) and value.lower() in ("", "none")):
        return None
    return _to_int(value)


def _keep(value: Any) -> Any:
    return value


_Converters = dict[str, Callable[[Any], Any]]

_COMMON: _Converters = {"default_ttl": _keep, "serializer": _keep}
_STORE: _Converters = {
    "compress": _keep,
    "compress_threshold": _keep,
    "signing_key": _keep,
    "prefix": _keep,
}
_PARAMETERS: dict[str, _Converters] = {
    "shm": {
        **_COMMON,
        **_STORE,
        "name": _keep,
        "path": _keep,
        "size": _keep,
        "shards": _to_int,
        "recreate": _to_bool,
        "allow_foreign_owner": _to_bool,
    },
    "memory": {
        **_COMMON,
        "max_entries": _to_optional_int,
        "max_bytes": _to_optional_size,
        "max_value_size": _to_optional_size,
    },
    "redis": {
        **_COMMON,
        **_STORE,
        "socket_timeout": _to_float,
        "connect_timeout": _to_float,
        "max_connections": _to_optional_int,
        "retries": _to_int,
        "health_check_interval": _to_int,
        "client": _keep,
    },
    "redis-cluster": {
        **_COMMON,
        **_STORE,
        "nodes": _keep,
        "socket_timeout": _to_float,
        "connect_timeout": _to_float,
        "max_connections": _to_optional_int,
        "retries": _to_int,
        "health_check_interval": _to_int,
        "password": _keep,
        "username": _keep,
    },
    "redis-sentinel": {
        **_COMMON,
        **_STORE,
        "sentinels": _keep,
        "service": _keep,
        "db": _to_int,
        "password": _keep,
        "username": _keep,
        "sentinel_password": _keep,
        "socket_timeout": _to_float,
        "connect_timeout": _to_float,
        "max_connections": _to_optional_int,
        "retries": _to_int,
        "health_check_interval": _to_int,
    },
    "memcached": {
        **_COMMON,
        **_STORE,
        "servers": _keep,
        "timeout": _to_float,
        "connect_timeout": _to_float,
        "max_pool_size": _to_optional_int,
        "max_value_size": _to_size,
    },
    "null": {"default_ttl": _keep},
}
_ALIASES = {"ttl": "default_ttl"}
_DRIVER_NAMES = {
    "nearcache": "shm",
    "shm": "shm",
    "memory": "memory",
    "redis": "redis",
    "rediss": "redis",
    "valkey": "redis",
    "valkeys": "redis",
    "unix": "redis",
    "redis+cluster": "redis-cluster",
    "redis-cluster": "redis-cluster",
    "redis+sentinel": "redis-sentinel",
    "redis-sentinel": "redis-sentinel",
    "memcached": "memcached",
    "memcache": "memcached",
    "null": "null",
    "tiered": "tiered",
}


def _options(driver: str, raw: Mapping[str, Any], origin: str) -> dict[str, Any]:
    """Validate and convert a driver's options (from a URL query or a dict)."""
    allowed = _PARAMETERS[driver]
    options: dict[str, Any] = {}
    for name, value in raw.items():
        key = _ALIASES.get(name, name)
        if driver.startswith("redis") and key == "timeout":
            key = "socket_timeout"
        if key not in allowed:
            raise ConfigurationError(_unknown_option(origin, name, driver))
        try:
            options[key] = allowed[key](value)
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(f"{origin}: bad value for {name!r}: {exc}") from exc
    return options


def _known_options(driver: str) -> list[str]:
    """The option names a driver takes in a URL or dict, as users write them."""
    names = (set(_PARAMETERS[driver]) | {"ttl"}) - {"client", "servers", "default_ttl"}
    if driver == "redis":
        names = (names - {"socket_timeout"}) | {"timeout", "prefix"}
    return sorted(names)


def _unknown_option(origin: str, name: str, driver: str, passed_on: str = "") -> str:
    """The message for an unknown option: the closest known name, then all of them."""
    known = _known_options(driver)
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return (
        f"{origin}: unknown option {name!r} for {driver}{hint}; "
        f"nearcache's {driver} options are {', '.join(known)}{passed_on}"
    )


def _make(driver: str, options: dict[str, Any], origin: str = "configuration") -> Driver:
    """Instantiate a driver; bad option values become ConfigurationError."""
    try:
        return _instantiate(driver, options)
    except ConfigurationError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"{origin}: {exc}") from exc


def _instantiate(driver: str, options: dict[str, Any]) -> Driver:
    """Instantiate a driver (importing the optional client libraries on demand)."""
    if driver == "shm":
        from nearcache.drivers.shm import ShmDriver

        name = options.pop("name", None)
        return ShmDriver(name, **options)
    if driver == "memory":
        from nearcache.drivers.memory import MemoryDriver

        return MemoryDriver(**options)
    if driver == "redis":
        from nearcache.drivers.redis import RedisDriver

        return RedisDriver(**options)
    if driver == "redis-cluster":
        from nearcache.drivers.redis import RedisClusterDriver

        return RedisClusterDriver(**options)
    if driver == "redis-sentinel":
        from nearcache.drivers.redis import RedisSentinelDriver

        return RedisSentinelDriver(**options)
    if driver == "memcached":
        from nearcache.drivers.memcached import MemcachedDriver

        return MemcachedDriver(**options)
    from nearcache.drivers.null import NullDriver

    return NullDriver(**options)


def _split(url: str | Sequence[str]) -> list[str]:
    if isinstance(url, str):
        return url.split()
    return [str(part) for part in url]


def from_url(url: str | Sequence[str], **options: Any) -> Driver:
    """Make the cache a URL describes (two URLs: a tiered cache).

    Keyword arguments override URL parameters; for a tiered cache they are
    the :class:`~nearcache.tiered.TieredCache` options.

    Raises:
        ConfigurationError: unknown scheme or option, malformed value.
    """
    urls = _split(url)
    if len(urls) == 2:
        unknown = set(options) - _TIERED_OPTIONS
        if unknown:
            raise ConfigurationError(
                f"options for a tiered cache are {sorted(_TIERED_OPTIONS)}, not {sorted(unknown)}"
            )
        return _tiered(from_url(urls[0]), from_url(urls[1]), options)
    if len(urls) != 1:
        raise ConfigurationError(f"expected one URL, or two for a tiered cache: {url!r}")
    return _from_one_url(urls[0], options)


def _from_one_url(url: str, overrides: Mapping[str, Any]) -> Driver:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    driver = _DRIVER_NAMES.get(scheme)
    if driver is None or driver == "tiered":
        raise ConfigurationError(
            f"unknown cache URL scheme {parts.scheme!r} in {_redact(url)!r}; use nearcache://, "
            "memory://, redis://, rediss://, unix://, redis+cluster://, redis+sentinel://, "
            "memcached:// or null://"
        )
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    origin = _redact(url)
    if driver == "redis":
        mine = {
            k: v
            for k, v in query.items()
            if k == "timeout" or _ALIASES.get(k, k) in _PARAMETERS["redis"]
        }
        rest = {k: v for k, v in query.items() if k not in mine}
        options = _options("redis", mine, origin)
        options.update(overrides)
        netloc = parts.netloc
        base_scheme = {"valkey": "redis", "valkeys": "rediss"}.get(scheme, scheme)
        clean = urlunsplit((base_scheme, netloc, parts.path, urlencode(rest), ""))
        if "client" not in options:
            options["url"] = clean
        driver_object = _make("redis", options, origin)
        _check_redis_options(driver_object, origin)
        return driver_object
    options = _options(driver, query, origin)
    options.update(overrides)
    if driver == "shm":
        if parts.path not in ("", "/"):
            if parts.netloc:
                raise ConfigurationError(
                    f"{origin}: use nearcache://NAME for a named cache or nearcache:///PATH"
                )
            options.setdefault("path", unquote(parts.path))
        elif parts.netloc:
            options.setdefault("name", unquote(parts.netloc))
    elif driver == "redis-cluster":
        _userinfo(parts.netloc, options)
        options.setdefault("nodes", _hosts(parts.netloc, origin))
    elif driver == "redis-sentinel":
        _userinfo(parts.netloc, options)
        options.setdefault("sentinels", _hosts(parts.netloc, origin))
        path = [unquote(part) for part in parts.path.split("/") if part]
        if not path or len(path) > 2:
            raise ConfigurationError(f"{origin}: expected redis+sentinel://HOSTS/SERVICE[/DB]")
        options.setdefault("service", path[0])
        if len(path) == 2:
            options.setdefault("db", _options(driver, {"db": path[1]}, origin)["db"])
    elif driver == "memcached":
        if parts.netloc:
            servers = [server for server in unquote(parts.netloc).split(",") if server]
        elif parts.path:
            servers = [unquote(parts.path)]
        else:
            servers = ["127.0.0.1:11211"]
        options.setdefault("servers", servers if len(servers) > 1 else servers[0])
    return _make(driver, options, origin)


def _userinfo(netloc: str, options: dict[str, Any]) -> None:
    """``user:password@`` of a URL's network location into ``options``."""
    creds, at, _ = netloc.rpartition("@")
    if not at:
        return
    user, colon, password = creds.partition(":")
    if user:
        options.setdefault("username", unquote(user))
    if colon:
        options.setdefault("password", unquote(password))


def _hosts(netloc: str, origin: str) -> list[str]:
    """The ``host:port`` list of a multi-host URL (``h1:p1,h2:p2``)."""
    hosts = [host for host in netloc.rpartition("@")[2].split(",") if host]
    if not hosts:
        raise ConfigurationError(f"{origin}: no host:port given")
    return hosts


def _check_redis_options(driver: Driver, origin: str) -> None:
    """Make (without connecting) one connection, so redis-py rejects unknown parameters now."""
    pool = driver.client.connection_pool  # type: ignore[attr-defined]
    try:
        pool.connection_class(**pool.connection_kwargs)
    except TypeError as exc:
        driver.close()
        unknown = re.search(r"unexpected keyword argument '([^']+)'", str(exc))
        if unknown is None:
            raise ConfigurationError(f"{origin}: {exc}") from None
        raise ConfigurationError(
            _unknown_option(
                origin,
                unknown.group(1),
                "redis",
                "; other parameters go to redis-py, which does not take it either",
            )
        ) from None


def from_dict(config: Mapping[str, Any]) -> Driver:
    """Make the cache a dict describes (see the module documentation).

    Raises:
        ConfigurationError: missing or unknown driver, unknown option.
    """
    settings = dict(config)
    driver_name = settings.pop("driver", None)
    if driver_name is None:
        if "l1" in settings or "l2" in settings:
            driver_name = "tiered"
        elif "url" in settings:
            url = settings.pop("url")
            return from_url(url, **_options_for_url(url, settings))
        else:
            raise ConfigurationError("a cache configuration needs 'driver', 'url' or 'l1'/'l2'")
    driver = _DRIVER_NAMES.get(str(driver_name).lower())
    if driver is None:
        raise ConfigurationError(f"unknown driver {driver_name!r}")
    if driver == "tiered":
        try:
            l1_spec, l2_spec = settings.pop("l1"), settings.pop("l2")
        except KeyError:
            raise ConfigurationError("a tiered cache needs both 'l1' and 'l2'") from None
        unknown = set(settings) - _TIERED_OPTIONS
        if unknown:
            raise ConfigurationError(f"unknown options for a tiered cache: {sorted(unknown)}")
        return _tiered(_tier(l1_spec), _tier(l2_spec), settings)
    url = settings.pop("url", None)
    if url is not None:
        return from_url(url, **_options_for_url(url, settings))
    origin = f"{driver} configuration"
    return _make(driver, _options(driver, settings, origin), origin)


def _options_for_url(url: Any, settings: Mapping[str, Any]) -> dict[str, Any]:
    """Validate dict options given beside a URL, for that URL's driver."""
    if not isinstance(url, str) or len(url.split()) != 1:
        return dict(settings)
    driver = _DRIVER_NAMES.get(urlsplit(url).scheme.lower(), "")
    if driver not in _PARAMETERS:
        return dict(settings)
    return _options(driver, settings, "configuration")


def _tier(spec: Any) -> Driver:
    if isinstance(spec, Driver):
        return spec
    if isinstance(spec, str):
        return from_url(spec)
    if isinstance(spec, Mapping):
        return from_dict(spec)
    raise ConfigurationError(f"a tier is a URL, a dict or a Driver, not {type(spec).__name__}")


def _tiered(l1: Driver, l2: Driver, options: Mapping[str, Any]) -> Driver:
    from nearcache.tiered import TieredCache

    settings = dict(options)
    if "l1_ttl" in settings and isinstance(settings["l1_ttl"], str):
        settings["l1_ttl"] = parse_duration(settings["l1_ttl"])
    try:
        return TieredCache(l1, l2, **settings)
    except (TypeError, ValueError) as exc:
        l1.close()
        l2.close()
        raise ConfigurationError(f"tiered cache: {exc}") from exc


def _redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
