"""A per-client rate limit on work: a token bucket of route points per client address."""
from __future__ import annotations

import time

POINTS_PER_UNIT = 1000
"""Route points (after densification) that one unit of the rate limit pays for."""
BODY_BYTES_PER_UNIT = 32 * 1024
"""Body bytes that one unit pays for at admission (from ``Content-Length``, before the body is read): more than
1,000 points as JSON take (about 24 bytes a point), so an ordinary request pays no more up front than its points."""
LIGHT_UNITS = 0.1
"""What a request that is not ``POST /eta`` costs (``/healthz``, an unknown path, a preflight): cheap, counted."""


class RateLimit:
    """At most ``rate`` units of work per second per client on average, bursts of up to ``burst`` (default:
    ``rate``, at least 1). A request costs what it asks of the model (the service: its routes' points after
    densification, in units of ``POINTS_PER_UNIT`` = 1,000 points, at least 1 per request).

    :meth:`check` (before the body is read) refuses a client whose bucket holds less than one unit; :meth:`spend`
    (once the request's points are known, before it is built) takes its cost, or refuses it when the bucket holds
    less than ``min(cost, burst)``: a request costlier than the burst passes only from a full bucket and leaves it
    in debt, so a client's average stays within ``rate`` whatever its requests' size. Both return 0.0 or, when
    refusing, the seconds until the request would pass (HTTP 429 with that Retry-After). Buckets of clients idle
    long enough to be full again are dropped, so memory follows the active clients."""

    def __init__(self, rate: float, burst: float | None = None, clock=time.monotonic):
        if not rate > 0:
            raise ValueError(f"rate must be > 0 per second, got {rate}")
        self.rate, self.burst, self.clock = float(rate), float(burst or max(rate, 1.0)), clock
        self._buckets: dict[str, tuple[float, float]] = {}  # client → (tokens, at)

    def _tokens(self, client: str) -> tuple[float, float]:
        now = self.clock()
        tokens, at = self._buckets.get(client, (self.burst, now))
        if len(self._buckets) > 10_000:
            full = [c for c, (t, a) in self._buckets.items() if t + (now - a) * self.rate >= self.burst]
            for c in full:
                del self._buckets[c]
        return min(self.burst, tokens + (now - at) * self.rate), now

    def check(self, client: str) -> float:
        tokens, _ = self._tokens(client)
        return 0.0 if tokens >= 1.0 else (1.0 - tokens) / self.rate

    def spend(self, client: str, cost: float = 1.0) -> float:
        tokens, now = self._tokens(client)
        need = min(cost, self.burst)
        if tokens < need:
            self._buckets[client] = (tokens, now)
            return (need - tokens) / self.rate
        self._buckets[client] = (tokens - cost, now)
        return 0.0

    def top_up(self, client: str, paid: float, cost: float) -> float:
        """The rest of a request's ``cost`` once it is known, ``paid`` of it taken at admission by :meth:`spend`:
        refused (the seconds to wait) when the bucket, with ``paid`` given back, would hold less than
        ``min(cost, burst)``, as :meth:`spend` of the whole cost at once would be; ``paid`` stays spent."""
        tokens, now = self._tokens(client)
        if tokens + paid < min(cost, self.burst):
            self._buckets[client] = (tokens, now)
            return (min(cost, self.burst) - tokens - paid) / self.rate
        self._buckets[client] = (tokens - max(0.0, cost - paid), now)
        return 0.0

    def allow(self, client: str) -> float:
        """:meth:`spend` of one unit."""
        return self.spend(client, 1.0)
