"""A circuit breaker in front of L2, shared by the processes of a host.

A sick L2 (stopped, paused, partitioned) makes every call wait a full socket
timeout.  After ``failures`` consecutive failures the breaker *opens*: for
``backoff`` seconds nobody on the host calls L2, and every L2 call fails at
once with :class:`CircuitOpenError` (the tiered cache then applies its error
policy: reads are misses, L1 hits are still served).  When the back-off has
passed the breaker is *half-open*: one caller on the whole host is let
through as a probe; its success closes the breaker, its failure opens it
again with the back-off doubled (up to ``max_backoff``).

State::

    closed --(N failures)--> open --(backoff passed)--> half-open
       ^                      ^                              |
       |                      +--------(probe fails)---------+
       +-----------------------(probe succeeds)--------------+

The state lives in the shared L1 (two reserved keys), so all the processes
of a host learn of an outage from the first one that hits it, and only one
probe per back-off period per host waits for a timeout.  A process checks
the L1 key only while it has no reason to think L2 is healthy: in the
closed state a call costs one L1 lookup.  With an L1 that is private to the
process (``MemoryDriver``), the breaker is simply per process.
"""

from __future__ import annotations

import os
import time
from typing import Any

from nearcache.drivers.base import BackendError, Driver

__all__ = ["CircuitBreaker", "CircuitOpenError"]

_STATE_KEY = b"\x00nearcache:breaker:open-until"
_PROBE_KEY = b"\x00nearcache:breaker:probe"


class CircuitOpenError(BackendError):
    """L2 was not called: the circuit breaker is open after recent failures."""


class CircuitBreaker:
    """Fail L2 calls fast for a back-off period after failures (see the module doc).

    Args:
        l1: the shared L1 holding the state (``None``: this process only).
        failures: consecutive failures that open the breaker (0: never open).
        backoff: seconds the breaker stays open after it opens.
        max_backoff: upper bound of the back-off, doubled after each failed probe.
        probe_timeout: how long a half-open probe may take before another
            process may probe (a probe killed mid-call does not block others).
    """

    def __init__(
        self,
        l1: Driver | None = None,
        *,
        failures: int = 1,
        backoff: float = 1.0,
        max_backoff: float = 10.0,
        probe_timeout: float = 5.0,
    ) -> None:
        if failures < 0 or backoff <= 0 or max_backoff < backoff or probe_timeout <= 0:
            raise ValueError(
                "circuit breaker: failures >= 0, 0 < backoff <= max_backoff, probe_timeout > 0"
            )
        self._l1 = l1
        self.failures = failures
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.probe_timeout = probe_timeout
        self._consecutive = 0
        self._current_backoff = backoff
        self._local_open_until = 0.0  # when L1 is private, or as a cache of the shared state
        self._suspicious = False  # we saw a failure or an open state: check L1 until a success
        self._probing = False
        self.opened = 0
        self.rejected = 0
        self.probes = 0

    # -- shared state --------------------------------------------------------

    def _open_until(self) -> float:
        if self._l1 is None:
            return self._local_open_until
        try:
            value = self._l1.get(_STATE_KEY)
        except Exception:
            return self._local_open_until
        return float(value) if isinstance(value, (int, float)) else 0.0

    def _set_open(self, until: float) -> None:
        self._local_open_until = until
        if self._l1 is not None:
            try:
                # The key outlives the back-off a little, so a stale state cleans itself up.
                self._l1.set(_STATE_KEY, until, ttl=self.max_backoff + self.probe_timeout)
                self._l1.delete(_PROBE_KEY)
            except Exception:
                pass

    def _close(self) -> None:
        self._local_open_until = 0.0
        if self._l1 is not None:
            try:
                self._l1.delete(_STATE_KEY)
                self._l1.delete(_PROBE_KEY)
            except Exception:
                pass

    def _claim_probe(self) -> bool:
        if self._l1 is None:
            return True
        try:
            return self._l1.add(_PROBE_KEY, os.getpid(), ttl=self.probe_timeout)
        except Exception:
            return True

    # -- the calls -----------------------------------------------------------

    def before_call(self) -> None:
        """Raise :class:`CircuitOpenError` unless L2 may be called now."""
        if self.failures == 0:
            return
        now = time.monotonic()
        if now < self._local_open_until:
            self.rejected += 1
            raise CircuitOpenError("L2 circuit breaker is open")
        if not self._suspicious and self._l1 is None:
            return
        open_until = self._open_until()
        if open_until == 0.0:
            return  # closed (the common case: one L1 lookup)
        self._suspicious = True
        if now < open_until:
            self._local_open_until = open_until
            self.rejected += 1
            raise CircuitOpenError("L2 circuit breaker is open")
        # Half-open: one probe per host.
        if not self._claim_probe():
            self.rejected += 1
            raise CircuitOpenError("L2 circuit breaker is half-open; another process probes")
        self._probing = True
        self.probes += 1

    def success(self) -> None:
        """The L2 call succeeded."""
        if self._consecutive or self._suspicious or self._probing:
            self._consecutive = 0
            self._current_backoff = self.backoff
            self._suspicious = False
            self._probing = False
            self._close()

    def failure(self, exc: BaseException) -> None:
        """The L2 call failed with ``exc`` (a BackendError other than CircuitOpenError)."""
        if self.failures == 0:
            return
        self._consecutive += 1
        self._suspicious = True
        if self._probing:
            self._probing = False
            self._current_backoff = min(self._current_backoff * 2, self.max_backoff)
        elif self._consecutive < self.failures:
            return
        self.opened += 1
        self._set_open(time.monotonic() + self._current_backoff)

    @property
    def state(self) -> str:
        """``"closed"``, ``"open"`` or ``"half-open"`` as this process sees it now."""
        open_until = self._open_until()
        if open_until == 0.0:
            return "closed"
        return "open" if time.monotonic() < open_until else "half-open"

    def stats(self) -> dict[str, Any]:
        """State and counters (this process's)."""
        return {
            "state": self.state,
            "opened": self.opened,
            "rejected": self.rejected,
            "probes": self.probes,
            "backoff": self._current_backoff,
        }
