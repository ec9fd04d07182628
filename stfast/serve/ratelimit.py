"""A per-client rate limit: a token bucket per client address."""
from __future__ import annotations

import time


class RateLimit:
    """At most ``rate`` requests per second per client on average, bursts of up to ``burst`` (default: ``rate``,
    at least 1). :meth:`allow` spends a token of ``client`` and returns 0.0, or, with none left, the seconds
    until the next one (the request is refused: HTTP 429 with that Retry-After). Buckets of clients idle long
    enough to be full again are dropped, so memory follows the active clients."""

    def __init__(self, rate: float, burst: float | None = None, clock=time.monotonic):
        if not rate > 0:
            raise ValueError(f"rate must be > 0 requests/s, got {rate}")
        self.rate, self.burst, self.clock = float(rate), float(burst or max(rate, 1.0)), clock
        self._buckets: dict[str, tuple[float, float]] = {}  # client → (tokens, at)

    def allow(self, client: str) -> float:
        now = self.clock()
        tokens, at = self._buckets.get(client, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * self.rate)
        if len(self._buckets) > 10_000:
            full = [c for c, (t, a) in self._buckets.items() if t + (now - a) * self.rate >= self.burst]
            for c in full:
                del self._buckets[c]
        if tokens < 1.0:
            self._buckets[client] = (tokens, now)
            return (1.0 - tokens) / self.rate
        self._buckets[client] = (tokens - 1.0, now)
        return 0.0
