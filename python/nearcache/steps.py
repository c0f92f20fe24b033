"""Protocols as plain state transitions: what a core yields, and the sync driver.

The lock (:mod:`nearcache.lockcore`), the stampede protection of memoize
(:mod:`nearcache.stampede`) and the tag records (:mod:`nearcache.generations`)
are each written once, as generators that do no I/O: a core *yields* what
it needs done and is *sent* the outcome, like h11's state machine that is
handed bytes and returns events.  Two thin drivers do the work: :func:`run`
blocks, :func:`run_async` awaits (the async API hands it its store calls,
its sleep and its way to spawn a task).  A fix to a
protocol lands in the core and both APIs get it.

What a core yields:

* :class:`Call` ``(method, *args)``: call that method of the store and send
  the result back (an exception the store raises is thrown into the core,
  which may catch it);
* :class:`Sleep` ``(seconds)``: wait, then send ``None``;
* :class:`Compute`: run the memoized function, send its result (or throw
  its exception);
* :class:`Spawn` ``(steps)``: run ``steps`` in the background (a thread, a
  task) and send ``None`` at once.

A driver loops: send, perform, send, until the core returns its result.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable, Generator
from typing import Any, NamedTuple, TypeAlias, TypeVar, cast

__all__ = ["Call", "Compute", "Op", "Sleep", "Spawn", "Steps", "call", "run", "run_async"]

R = TypeVar("R")


class Call(NamedTuple):
    """Call ``method(*args)`` on the store."""

    method: str
    args: tuple[Any, ...]


class Sleep(NamedTuple):
    """Wait ``seconds``."""

    seconds: float


class Compute(NamedTuple):
    """Run the function being memoized."""


class Spawn(NamedTuple):
    """Run ``steps`` in the background; the core goes on at once."""

    steps: Steps[None]
    name: str


Op: TypeAlias = Call | Sleep | Compute | Spawn
#: A core: yields :data:`Op` values, is sent their outcomes, returns ``R``.
Steps: TypeAlias = Generator[Op, Any, R]


def call(method: str, *args: Any) -> Call:
    """The op calling ``store.method(*args)``."""
    return Call(method, args)


def run(
    steps: Steps[R],
    store: Any,
    compute: Callable[[], Any] | None = None,
) -> R:
    """Drive ``steps`` to their result, blocking: store calls on ``store``,
    sleeps with :func:`time.sleep`, spawns on daemon threads.

    The loop is written out (no helper call per op): a lock's acquire and
    release are two store calls each driven through here, and the driver's
    own cost is most of what they take beyond the calls."""
    reply: Any = None
    error: BaseException | None = None
    while True:
        try:
            op = steps.send(reply) if error is None else steps.throw(error)
        except StopIteration as done:
            return cast(R, done.value)
        error = None
        try:  # what the op raises is thrown into the core, which may handle it
            if op.__class__ is Call:
                reply = getattr(store, op.method)(*op.args)
            elif op.__class__ is Sleep:
                time.sleep(op.seconds)
                reply = None
            elif op.__class__ is Compute:
                assert compute is not None, "a core asked to compute without a function"
                reply = compute()
            else:
                assert isinstance(op, Spawn)
                thread = threading.Thread(target=run, args=(op.steps, store, compute), name=op.name)
                thread.daemon = True  # a refresh must not keep the process alive
                thread.start()
                reply = None
        except BaseException as exc:
            reply, error = None, exc


async def run_async(
    steps: Steps[R],
    perform: Callable[[Call], Awaitable[Any]],
    sleep: Callable[[float], Awaitable[Any]],
    compute: Callable[[], Awaitable[Any]] | None = None,
    spawn: Callable[[Spawn], None] | None = None,
) -> R:
    """Drive ``steps`` to their result, awaiting: ``perform`` makes a store
    call, ``sleep`` waits, ``compute`` runs the function, ``spawn`` starts a
    background run (each the event loop's way: asyncio or trio)."""

    async def perform_op(op: Op) -> Any:
        if op.__class__ is Call:
            return await perform(op)
        if op.__class__ is Sleep:
            return await sleep(op.seconds)
        if op.__class__ is Compute:
            assert compute is not None, "a core asked to compute without a function"
            return await compute()
        assert isinstance(op, Spawn) and spawn is not None
        spawn(op)
        return None

    reply: Any = None
    error: BaseException | None = None
    while True:
        try:
            op = steps.send(reply) if error is None else steps.throw(error)
        except StopIteration as done:
            return cast(R, done.value)
        error = None
        try:  # thrown into the core, as in run()
            reply = await perform_op(op)
        except BaseException as exc:
            reply, error = None, exc
