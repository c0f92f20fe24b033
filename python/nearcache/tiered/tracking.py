"""Server-assisted invalidation: Redis ``CLIENT TRACKING`` in broadcast mode.

Instead of publishing a message on every write, each host's listener asks
the server to tell it about every key under the L2 prefix that anybody
modifies::

    CLIENT ID                                    -> n
    CLIENT TRACKING ON REDIRECT n BCAST PREFIX <L2 prefix>
    SUBSCRIBE __redis__:invalidate

(RESP2: the invalidations are redirected to the connection itself, which
receives them as pub/sub messages whose payload is the list of keys.)  A
write is then a plain ``SET``: no publish, no stream entry.  The server
sends an invalidation for every modification, by nearcache or anything
else, expiry and eviction included, to every tracking host, the writer's own
host too (which drops its fresh copy: one more L2 read).  Like pub/sub, what
happens while the connection is down is lost, so L1 is cleared whenever
tracking is (re)established.  One Redis server only (Redis >= 6): on a
cluster, tracking is per node.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nearcache.tiered.invalidators import InvalidationListener, RedisInvalidator
from nearcache.tiered.resp import command

__all__ = ["TrackingInvalidator"]


class TrackingInvalidator(RedisInvalidator):
    """Invalidations sent by the server itself (see the module doc).

    Args:
        url: the L2 Redis server.
        prefix: the L2 key prefix; keys are handed to the listener without it.
        options: as for :class:`~nearcache.tiered.RedisInvalidator`.
    """

    #: Writers publish nothing: the server notifies the listeners.
    server_side = True

    def __init__(self, url: str, prefix: bytes = b"", **options: Any) -> None:
        super().__init__(url, "__redis__:invalidate", **options)
        self.prefix = bytes(prefix)
        self.flushes = 0

    def publish(self, keys: Sequence[bytes]) -> None:
        """Nothing to send: the server tracks the writes."""

    def publish_clear(self) -> None:
        """Nothing to send: deleting the keys invalidates them."""

    def _subscribe_commands(self, connection: Any) -> bytes:
        connection.send_command("CLIENT", "ID")
        client_id = str(connection.read_response()).encode()
        return command(
            b"CLIENT", b"TRACKING", b"ON", b"REDIRECT", client_id, b"BCAST", b"PREFIX", self.prefix
        ) + command(b"SUBSCRIBE", self.channel)

    def _deliver(self, listener: InvalidationListener, data: Any) -> None:
        if data is None:  # FLUSHDB / FLUSHALL
            self.flushes += 1
            listener.on_clear()
            return
        if not isinstance(data, list):
            self.ignored += 1
            return
        size = len(self.prefix)
        keys = [
            key[size:] for key in data if isinstance(key, bytes) and key.startswith(self.prefix)
        ]
        if keys:
            listener.on_invalidate(keys)
        self.received += 1  # once applied: whoever sees the count grow sees the effect
