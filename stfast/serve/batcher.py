"""Dynamic batching: concurrent requests share one forward pass.

One model forward pass of B routes costs far less than B passes of one route (the fused ops run the
batch's points together), so a service that runs one pass per request wastes most of its time on
per-pass overhead. :class:`DynamicBatcher` keeps the waiting requests in order; a batch starts from the
oldest, takes the later ones that fit its caps (routes, points, padding), and runs in a worker thread so the
event loop keeps accepting requests meanwhile. ``max_batch = 1`` is one request per pass.

It waits only for company that is on its way: requests that have arrived but are still being read and checked
(:meth:`DynamicBatcher.arriving`). When none is, the batch starts at once, so a lone client sending back to
back never waits for nobody; when some are, the oldest waits at most ``max_wait_s`` for them.

A batch is formed so that a short route does not pay for a long one's padding: the pass pads every route to the
batch's longest, and an item joins only while the padded points stay within 1.5 times the real ones (or within
:data:`FREE_PADDING` points, a pass that costs little whatever its shape); the items left out form the next
batches, so routes of like lengths end up together.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

FREE_PADDING = 8192
"""Padded points (routes × longest route) a batch may have whatever its real points."""


class QueueFull(RuntimeError):
    """More work is waiting than the batcher accepts (the service answers 429)."""


class DynamicBatcher:
    """Gathers submitted items (each ``n`` routes, ``points`` points, its longest route ``longest`` points) into
    batches of at most ``max_batch`` routes and ``max_batch_points`` points.

    Args:
        forward: called in a worker thread with a list of items, returns one result per item (in order). When it
            raises on a batch of several items, each item is run alone, so only the item at fault gets the error.
        max_batch: routes per call of ``forward`` (≥ 1); an item larger than that goes alone.
        max_wait_s: the longest the oldest waiting item waits for arriving ones before its batch starts (≥ 0).
        max_queue: points that may wait; beyond, :meth:`submit` raises :class:`QueueFull`.
        max_batch_points: points per call of ``forward`` (an item with more goes alone); None: no cap.
        padding: cap the batch's padding (module docstring); False: items of any length share a batch.
        thread_name: the worker thread's name.
        pool: run ``forward`` in this executor (shared with other work) instead of a thread of its own; the
            batcher still runs one call at a time.

    Attributes ``forward_passes`` and ``routes`` count calls of ``forward`` and the routes they held, ``busy_s`` and
    ``busy_cpu_s`` the wall and thread CPU seconds spent in them, ``waited_s`` the seconds batches waited for
    arriving requests.
    Create it anywhere; it starts its loop on the first :meth:`submit`, in that event loop.
    """

    def __init__(self, forward: Callable[[list], list], max_batch: int, max_wait_s: float, max_queue: int = 10_000_000,
                 max_batch_points: int | None = None, padding: bool = True, thread_name: str = "stfast-forward",
                 pool: ThreadPoolExecutor | None = None):
        if max_batch < 1 or max_wait_s < 0:
            raise ValueError(f"max_batch must be ≥ 1 and max_wait ≥ 0, got {max_batch} and {max_wait_s}")
        self.forward, self.max_batch, self.max_wait_s, self.max_queue = forward, max_batch, max_wait_s, max_queue
        self.max_batch_points = max_batch_points or float("inf")
        self.padding = padding
        self.forward_passes = 0
        self.routes = 0
        self.busy_s = 0.0
        self.busy_cpu_s = 0.0
        self.waited_s = 0.0
        self._pending: list = []  # [item, n routes, points, longest, future, enqueued at, info], oldest first
        self._queued = 0  # points waiting
        self._arriving = 0
        self._event: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._pool = pool or ThreadPoolExecutor(1, thread_name_prefix=thread_name)

    @contextlib.contextmanager
    def arriving(self):
        """Marks a request on its way (being read and checked) for as long as the block runs: a waiting batch waits
        for it (up to ``max_wait_s``), and starts as soon as no request is on its way."""
        self._arriving += 1
        try:
            yield
        finally:
            self._arriving -= 1
            if self._arriving == 0 and self._event is not None:
                self._event.set()

    @property
    def queued_points(self) -> int:
        return self._queued

    def _start(self) -> None:
        if self._task is None or self._task.done():
            self._event = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._run())

    def reserve(self, points: int) -> None:
        """Raises QueueFull when ``points`` more would overflow the queue (checked before costly work)."""
        if self._queued + points > self.max_queue:
            raise QueueFull(f"{self._queued} points are waiting, the queue holds {self.max_queue}")

    async def submit(self, item, n: int, points: int | None = None, longest: int | None = None,
                     info: dict | None = None):
        """The result of ``forward`` for ``item`` (``n`` routes of ``points`` points in all, the longest
        ``longest``; both default to ``n``), once its batch has run. Raises QueueFull, or what ``forward`` raised
        for it. Cancelled (its client gone), the item leaves the queue before its pass. ``info``, when given,
        gets ``"batch"``: the routes of the pass that carried it (what the access log shows)."""
        points = n if points is None else points
        self._start()
        self.reserve(points)
        fut = asyncio.get_running_loop().create_future()
        self._pending.append([item, n, points, longest or points, fut, time.monotonic(), info])
        self._queued += points
        self._event.set()
        return await fut

    def _take(self) -> list:
        """The next batch: the oldest item, then the later ones that fit the caps, in order."""
        self._pending = [e for e in self._pending if not e[4].done() or self._drop(e)]
        first = self._pending[0]
        batch, routes, points, longest = [first], first[1], first[2], first[3]
        for e in self._pending[1:]:
            if routes + e[1] > self.max_batch:
                if routes >= self.max_batch:
                    break
                continue
            lg = max(longest, e[3])
            if points + e[2] > self.max_batch_points or (
                    self.padding and (routes + e[1]) * lg > max(1.5 * (points + e[2]), FREE_PADDING)):
                continue
            batch.append(e)
            routes, points, longest = routes + e[1], points + e[2], lg
        taken = {id(e) for e in batch}
        self._pending = [e for e in self._pending if id(e) not in taken]
        self._queued -= points
        return batch

    def _drop(self, e) -> bool:  # a cancelled item (its client went away) leaves the queue
        self._queued -= e[2]
        return False

    def _wait_left(self) -> float:
        if not self._arriving:
            return 0.0
        routes = sum(e[1] for e in self._pending)
        return 0.0 if routes >= self.max_batch else self._pending[0][5] + self.max_wait_s - time.monotonic()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._pending = [e for e in self._pending if not e[4].done() or self._drop(e)]
            if not self._pending:
                self._event.clear()
                await self._event.wait()
                continue
            t0 = time.monotonic()
            while (left := self._wait_left()) > 0:
                self._event.clear()
                try:
                    await asyncio.wait_for(self._event.wait(), left)
                except asyncio.TimeoutError:
                    break
            self.waited_s += time.monotonic() - t0
            self._pending = [e for e in self._pending if not e[4].done() or self._drop(e)]
            if not self._pending:
                continue
            live = self._take()
            t0 = time.monotonic()
            results = await loop.run_in_executor(self._pool, self._forward_isolated, [e[0] for e in live])
            self.busy_s += time.monotonic() - t0
            self.forward_passes += 1
            routes = sum(e[1] for e in live)
            self.routes += routes
            for e, r in zip(live, results):
                if e[4].done():
                    continue
                if e[6] is not None:
                    e[6]["batch"] = routes
                if isinstance(r, _Failed):
                    e[4].set_exception(r.exc)
                else:
                    e[4].set_result(r)

    def _forward_isolated(self, items: list) -> list:
        """:meth:`_forward_or_each`, its thread's CPU seconds counted in ``busy_cpu_s``."""
        t0 = time.thread_time()
        try:
            return self._forward_or_each(items)
        finally:
            self.busy_cpu_s += time.thread_time() - t0

    def _forward_or_each(self, items: list) -> list:
        """``forward(items)``; if it raises, each item alone, so that only the item at fault gets its error."""
        try:
            return self.forward(items)
        except Exception as exc:
            if len(items) == 1:
                return [_Failed(exc)]
        out = []
        for it in items:
            try:
                out.append(self.forward([it])[0])
            except Exception as exc:
                out.append(_Failed(exc))
        return out


class _Failed:
    def __init__(self, exc: BaseException):
        self.exc = exc
