"""The ETA service: an ASGI app (FastAPI) over a :class:`~stfast.train.trained.TrainedModel`.

Endpoints:

* ``POST /eta`` with ``{"route": [[lng, lat], ...], "departure": "2016-11-01T08:30:00+08:00", "driver": ...,
  "states": [...], "densify": true}`` → ``{"eta_s": ..., "km": ..., "points": ...}`` (the number
  :meth:`TrainedModel.eta` gives; ``km`` the route's length, ``points`` what the model read after
  densification); ``{"routes": [{...}, ...]}`` → ``{"etas": [{...}, ...]}`` in the order given.
* ``GET /healthz``: status, model and data summary, the training area's extent, batching counters, limits. It
  names no file or folder, and needs no token.
* ``GET /coverage``: the training area's occupied cells (what the page draws).
* ``GET /``: a self-contained page (no external resources) to click or paste a route and see its ETA.

Every answer but a 200 is JSON ``{"error": ..., "route": i, "field": ...}``: 400 a body that is not JSON (or
nested too deep), 401 a missing or wrong token (``--token-file``), 403 a cross-origin browser request not allowed
by ``--cors-origin``, 404 / 405 an unknown path or method, 408 a body that did not arrive in time, 413 a body,
route, request or batch over its limit (the message names it), 422 a request that is JSON but wrong (naming the
route and field), 429 over the client's rate limit or a full queue (with ``Retry-After``), 500 a fault of ours
(that request's alone), 503 over the connection limit. A request names no file: nothing a request sends reaches the
file system.

* ``POST /admin/reload`` (a service with a token only; 403 otherwise): reload the checkpoint now (:mod:`.swap`; also
  on SIGHUP, and with ``--watch`` when the file changes). Each ``/eta`` answer names the model that computed it:
  ``"model"`` in the body and the ``X-Model-Version`` header (its checkpoint file's SHA-256, 12 hex digits).

The path of a request (docs/serve.md): charged to its client's rate limit on arrival (a body by its
``Content-Length``, before it is read), its body is read with a size cap (:mod:`.protocol` times it), parsed and
checked in a worker thread (:mod:`.request`: depth, types, point counts after densification, before any costly
step), its charge topped up by points, built into trips in that worker (densification, distances,
calendar ids), and only then joins a batch (:mod:`.batcher`), so a request in a batch holds nothing that can fail
its batch-mates. A request whose client has gone leaves the queue before its pass.
"""
from __future__ import annotations

import asyncio
import contextlib
import errno
import hmac
import ipaddress
import logging
import math
import re
import signal
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from importlib import resources

import numpy as np
import orjson
import uvicorn
from fastapi import FastAPI, Request  # module level: FastAPI resolves the handlers' annotations here
from fastapi.responses import HTMLResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..data.geo import haversine_km
from ..data.routes import MAX_ROUTE_POINTS, RouteError
from ..data.trips import Trips
from ..train.trained import TrainedModel
from .batcher import DynamicBatcher, QueueFull
from .densify import densify_many
from .ratelimit import BODY_BYTES_PER_UNIT, LIGHT_UNITS, POINTS_PER_UNIT, RateLimit
from .request import MAX_ROUTES_PER_REQUEST, ApiError, Checked, check_body, parse_json
from .swap import WATCH_INTERVAL_S, Reloader, ServedModel

log = logging.getLogger("stfast.serve")
access = logging.getLogger("stfast.serve.access")
SMALL_REQUEST_POINTS = 2000
"""Requests of up to this many points (after densification) are built together (one densification for all of
them) and batched together; a larger one is built on its own and runs in its own forward thread, so that a short
request never waits behind a heavy one's building or pass (the two passes then share the cores)."""
LARGE_BODY_BYTES = 64 * 1024
"""Bodies larger than this (room for more than about 2,700 points) are parsed and checked in the thread that builds
large requests (``stfast-build-large``), so that a burst of them does not hold up small requests' checks."""
# the access log names these; any other path is "?"
KNOWN_PATHS = ("/eta", "/healthz", "/coverage", "/", "/admin/reload")
OPEN_PATHS = ("/healthz", "/")  # answered without a token: health checks, and the page (it sends the token)
PAGE_HEADERS = {"X-Frame-Options": "DENY", "Content-Security-Policy": "frame-ancestors 'none'",
                "X-Content-Type-Options": "nosniff"}


def json_response(obj, status: int = 200, headers: dict | None = None) -> Response:
    """``obj`` as a JSON response, encoded once by orjson (text it cannot encode, a lone surrogate, is escaped
    by the stdlib instead)."""
    try:
        body = orjson.dumps(obj)
    except TypeError:
        import json

        body = json.dumps(obj, ensure_ascii=True, default=str).encode("ascii")
    return Response(body, status, headers, media_type="application/json")


def error_response(e: ApiError) -> Response:
    return json_response(e.body(), e.status, e.headers)


def build_items(model: TrainedModel, items: list[list[Checked]]) -> list:
    """Checked requests built into the trips the model reads, in a worker thread: the densified routes of all
    ``items`` in one :func:`~.densify.densify_many` call, then one :meth:`TrainedModel.route_trips` call for the
    routes of all of them (coverage, distances, calendar ids; per request only when one of them is refused, to
    find whose). Each item's result: (Trips, pos [len(item)]: its routes' rows in that Trips, which the items
    built together share) or its :class:`ApiError` (413/422 naming the route, in the request, and the field),
    so that one request's error is its own."""
    spacing, kernel = model.densify_spacing_km(), model.norm_stats.kernel_size
    flat = [(k, j) for k, item in enumerate(items) for j, r in enumerate(item) if r.densify]
    dense = dict(zip(flat, densify_many([items[k][j].route for k, j in flat], [items[k][j].states for k, j in flat],
                                        spacing)))
    out, ready = [], []  # ready: (k, points, states) of the items whose densified routes passed
    for k, item in enumerate(items):
        try:
            pts, states = [], []
            for j, r in enumerate(item):
                if r.densify:
                    lng, lat, st = dense[(k, j)]
                    if len(lng) < kernel:
                        km = float(haversine_km(lng[:-1], lat[:-1], lng[1:], lat[1:]).sum())
                        raise ApiError(422, f"{len(lng)} points ({km:.3f} km) after densification, DeepTTE's "
                                            f"geo-conv needs at least kernel_size={kernel}", j, "route")
                    pts.append(np.stack([lng, lat], 1))
                    states.append(st)
                else:
                    pts.append(r.route)
                    states.append(r.states)
            out.append(None)
            ready.append((k, pts, states))
        except ApiError as e:
            out.append(e)
    if not ready:
        return out
    try:  # Why one call: its fixed cost (validation, calendar, arrays) is most of a short route's building
        trips = _route_trips(model, [p for _, pts, _ in ready for p in pts],
                             [r.departure for k, _, _ in ready for r in items[k]],
                             [r.driver for k, _, _ in ready for r in items[k]],
                             [s for _, _, states in ready for s in states])
        start = 0
        for k, pts, _ in ready:
            out[k] = (trips, np.arange(start, start + len(pts)))
            start += len(pts)
    except ApiError:  # one of them is refused: each alone, so that the error is its own
        for k, pts, states in ready:
            try:
                item = items[k]
                out[k] = (_route_trips(model, pts, [r.departure for r in item], [r.driver for r in item], states),
                          np.arange(len(item)))
            except ApiError as e:
                out[k] = e
    return out


def _route_trips(model: TrainedModel, pts, departures, drivers, states) -> Trips:
    try:
        return model.route_trips(pts, departures, drivers, None if all(s is None for s in states) else states,
                                 densify=False)
    except RouteError as e:
        raise ApiError(413 if e.too_large else 422, e.problem, e.index, e.field) from None


def build_served(items: list[tuple[ServedModel, list[Checked]]]) -> list:
    """:func:`build_items` of items (served model, checked requests), each group of items of one served model built
    with that model (its route profile and spacing), the results in the order of ``items``."""
    groups: dict[int, tuple] = {}
    for i, (served, reqs) in enumerate(items):
        groups.setdefault(id(served), (served, []))[1].append(i)
    out = [None] * len(items)
    for served, idx in groups.values():
        for i, r in zip(idx, build_items(served.model, [items[i][1] for i in idx])):
            out[i] = r
    return out


def route_batcher(model: TrainedModel | None, max_batch: int, max_wait_s: float, max_queue_points: int = 1_000_000,
                  max_batch_points: int | None = None, thread_name: str = "stfast-forward") -> DynamicBatcher:
    """The service's :class:`DynamicBatcher`. An item is one built request: (served model, Trips, its routes' rows
    there) as the service submits it, or (Trips, rows) predicted by ``model``; the items of a batch are grouped by
    the model they were built with, and each group's rows go through one ``predict`` of that model (passes of at
    most ``max_batch`` routes) in the worker thread, so a request is predicted by the model that built it, whatever
    model is current meanwhile (hot swap, :mod:`.swap`). Each request's result: [n_i, 3] float64 rows of (eta_s,
    km, points)."""

    def forward(items: list[tuple]) -> list[np.ndarray]:
        groups: dict[int, tuple] = {}
        for i, it in enumerate(items):
            m = it[0].model if len(it) == 3 else model
            groups.setdefault(id(m), (m, []))[1].append(i)
        out = [None] * len(items)
        for m, idx in groups.values():
            for i, r in zip(idx, forward_one(m, [items[i][-2:] for i in idx])):
                out[i] = r
        return out

    def forward_one(model: TrainedModel, items: list[tuple[Trips, np.ndarray]]) -> list[np.ndarray]:
        shared: dict[int, list] = {}  # items built together share a Trips: each Trips once, its rows taken
        for t, pos in items:
            shared.setdefault(id(t), [t, []])[1].append(pos)
        parts, base, start = [], {}, 0
        for key, (t, poss) in shared.items():
            rows = np.concatenate(poss)
            parts.append(t if np.array_equal(rows, np.arange(len(t))) else t.subset(rows))
            base[key] = start
            start += len(rows)
        trips = parts[0] if len(parts) == 1 else Trips.concat(parts)
        secs = model.predict(trips, batch_size=max_batch)
        table = np.stack([secs, trips.dist, trips.lengths.astype(np.float64)], 1)
        out = []
        for t, pos in items:  # the same order as the rows were taken
            at = base[id(t)]
            out.append(table[at:at + len(pos)])
            base[id(t)] = at + len(pos)
        return out

    return DynamicBatcher(forward, max_batch, max_wait_s, max_queue_points, max_batch_points, thread_name=thread_name)


LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def host_name(host: bytes) -> str:
    """The name of a ``Host`` header's value, lower case, without its port: ``b"[::1]:8000"`` -> ``"::1"``."""
    text = host.decode("latin-1").strip().lower()
    if text.startswith("["):
        return text[1:].partition("]")[0]
    return text.rpartition(":")[0] if text.count(":") == 1 else text


_HOST_RE = re.compile(rb"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9\-._~%!$&'()*+,;=]*)(:[0-9]{0,5})?")


def host_error(values: list[bytes]) -> str | None:
    """Why the ``Host`` header values of a request are refused (400), or None: more than one (proxies and the
    service could each read a different one), or one that is not ``host[:port]`` of RFC 3986 (a reg-name, an IPv4
    address, or an IPv6 address in brackets: ``[localhost]evil.example`` is none of them)."""
    if len(values) > 1:
        return f"{len(values)} Host headers: a request has one"
    if values:
        m = _HOST_RE.fullmatch(values[0])
        if m is None:
            return "the Host header is not host[:port]"
        if m.group(1).startswith(b"["):
            try:
                ipaddress.IPv6Address(m.group(1)[1:-1].decode("ascii"))
            except ValueError:
                return "the Host header's [...] is not an IPv6 address"
    return None


def default_hosts(bind: str, extra: tuple[str, ...] = ()) -> tuple[str, ...] | None:
    """The Host names a service bound to ``bind`` answers for: on a loopback address, the loopback names (a
    browser's page elsewhere cannot reach it by rebinding its own domain to 127.0.0.1), plus ``extra``
    (``--allowed-host``); on any other address ``extra``, or any name when none is given (behind a reverse proxy,
    name the public host)."""
    try:
        loopback = bind == "localhost" or ipaddress.ip_address(bind).is_loopback
    except ValueError:
        loopback = False
    if loopback:
        return (*LOOPBACK_NAMES, bind.lower(), *extra)
    return tuple(extra) or None


class Service:
    """The service's ASGI app. In front of FastAPI: the cross-origin rule (``cors_origins``), the token
    (``token``; :data:`OPEN_PATHS` need none), ``POST /eta`` straight to its handler (FastAPI's middleware stack and
    router cost about 0.1 ms of CPU per request), and a last guard: any exception becomes a JSON 500 of that request
    alone. ``state`` is the FastAPI app's (``state.batcher``)."""

    def __init__(self, app: FastAPI, eta, token: str | None, cors_origins: tuple[str, ...],
                 allowed_hosts: tuple[str, ...] | None = None, access_log: bool = True,
                 limit: RateLimit | None = None, max_body_bytes: int = 1 << 20):
        self.app, self.eta, self.state, self.access_log, self.limit = app, eta, app.state, access_log, limit
        self.max_body_bytes = max_body_bytes
        self.allowed_hosts = None if allowed_hosts is None else {h.lower() for h in allowed_hosts}
        self.token = None if token is None else token.encode()
        self.cors_origins = {o.rstrip("/").encode() for o in cors_origins}

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        info = scope["stfast"] = {}  # what the access log shows: "status" (499: the client left), "batch"
        started = False

        async def tracked_send(message):
            nonlocal started
            if not started:
                info["status"] = message.get("status")
            started = True
            await send(message)

        try:
            await self._route(scope, receive, tracked_send)
        except Exception:
            log.exception("error answering %s %s", scope.get("method"), _path_name(scope))
            if not started:
                await error_response(ApiError(500, "internal error; it was logged"))(scope, receive, tracked_send)
        if self.access_log and access.isEnabledFor(logging.INFO):
            access_line(scope, info, time.perf_counter() - t0)

    async def _route(self, scope, receive, send):
        headers = dict(scope["headers"])
        problem = host_error([v for k, v in scope["headers"] if k == b"host"])
        if problem is None and sum(k == b"authorization" for k, _ in scope["headers"]) > 1:
            problem = "more than one Authorization header"
        if problem is not None:
            return await error_response(ApiError(400, problem))(scope, receive, send)
        if self.allowed_hosts is not None and host_name(headers.get(b"host", b"")) not in self.allowed_hosts:
            # DNS rebinding: a page of evil.example resolved to this address is same-origin by its Host header
            return await error_response(ApiError(421, "this service does not answer for that Host header (allow a "
                                                      "name with --allowed-host)"))(scope, receive, send)
        if self.limit is not None:  # admission before any work, a token check included
            cost = admission_units(scope, headers, self.max_body_bytes)
            if (wait := self.limit.spend(client_of(scope), cost)) > 0:
                return await error_response(rate_error(self.limit, wait))(scope, receive, send)
            scope["stfast"]["paid"] = cost
        origin = headers.get(b"origin")
        cors = origin is not None and origin in self.cors_origins
        if origin is not None and not cors and origin.partition(b"://")[2] != headers.get(b"host"):
            return await error_response(ApiError(403, "cross-origin requests are refused (allow an origin with "
                                                      "--cors-origin)"))(scope, receive, send)
        if (not cors and headers.get(b"sec-fetch-site") == b"cross-site"
                and headers.get(b"sec-fetch-mode") != b"navigate"):
            return await error_response(ApiError(403, "cross-origin requests are refused (allow an origin with "
                                                      "--cors-origin)"))(scope, receive, send)
        if cors:
            if scope["method"] == "OPTIONS":  # a preflight
                return await Response(None, 204, {
                    "Access-Control-Allow-Origin": origin.decode("latin-1"), "Vary": "Origin",
                    "Access-Control-Allow-Methods": "GET, POST", "Access-Control-Max-Age": "600",
                    "Access-Control-Allow-Headers": "Authorization, Content-Type"})(scope, receive, send)
            inner = send

            async def send(message):
                if message["type"] == "http.response.start":
                    message = {**message, "headers": [*message.get("headers", []),
                                                      (b"access-control-allow-origin", origin), (b"vary", b"Origin")]}
                await inner(message)
        path = scope["path"]
        if self.token is not None and path not in OPEN_PATHS:
            scheme, _, credentials = headers.get(b"authorization", b"").partition(b" ")
            # the scheme is case-insensitive (RFC 9110 11.1); the token is compared in constant time
            if not (hmac.compare_digest(credentials.strip(b" "), self.token) and scheme.lower() == b"bearer"):
                return await error_response(ApiError(401, "a bearer token is required: Authorization: Bearer <token>",
                                                     headers={"WWW-Authenticate": "Bearer"}))(scope, receive, send)
        if path == "/eta" and scope["method"] == "POST":
            return await self.eta(scope, receive, send)
        await self.app(scope, receive, send)


def client_of(scope) -> str:
    c = scope.get("client")
    return c[0] if c else "?"


def admission_units(scope, headers: dict, max_body_bytes: int = 1 << 20) -> float:
    """What a request is charged to its client's rate limit on arrival, before anything is read or checked:
    ``POST /eta`` its body's ``Content-Length`` (up to ``max_body_bytes``: a larger body is refused unread) in units
    of :data:`BODY_BYTES_PER_UNIT` (at least 1; its points top it up once known), ``GET /coverage`` and the page
    1, anything else :data:`LIGHT_UNITS`."""
    path = scope.get("path")
    if path == "/eta" and scope.get("method") == "POST":
        size = headers.get(b"content-length", b"")
        if not (size.isdigit() and len(size) < 16):
            return 1.0
        return max(1.0, min(int(size), max_body_bytes) / BODY_BYTES_PER_UNIT)
    return 1.0 if path in ("/coverage", "/") else LIGHT_UNITS


def rate_error(limit: RateLimit, wait: float) -> ApiError:
    """The 429 of a client over ``limit``, ``wait`` seconds until it would pass."""
    return ApiError(429, f"rate limit: at most {limit.rate:g} units of work/s per client (a unit: a request of up to "
                         f"{POINTS_PER_UNIT} points or {BODY_BYTES_PER_UNIT // 1024} KiB of body; other paths "
                         f"{LIGHT_UNITS:g})", headers={"Retry-After": str(max(1, math.ceil(wait)))})


def _path_name(scope) -> str:
    """The request's path as logs may show it: one of :data:`KNOWN_PATHS`, else ``?`` (a path may carry anything
    the client put in it, a token included)."""
    path = scope.get("path")
    return path if path in KNOWN_PATHS else "?"


def access_line(scope, info: dict, seconds: float) -> None:
    """One access-log line (logger ``stfast.serve.access``, INFO): client address, method, path name, status, latency,
    and the routes of the forward pass that carried the request (``-``: none). Never the body, the query, a header
    or a file name."""
    client = scope.get("client")
    access.info("%s %s %s %s %.1f ms batch %s", str(client[0])[:64] if client else "-", scope.get("method", "-"),
                _path_name(scope), info.get("status", "-"), seconds * 1000.0, info.get("batch", "-"))


def describe(model: TrainedModel) -> str:
    """The model in one line, as the ready line gives it (no file name): kind, size, dtype, device, its data."""
    mc = model.model
    inner = getattr(mc, "members", None)
    first = inner[0] if inner is not None else mc
    cfg = model.config
    fp = (model.data_fingerprint or "")[:12]
    return (f"DeepTTE ({len(inner) if inner else 1} member{'s' if inner and len(inner) > 1 else ''}, hidden "
            f"{first.cfg.hidden_size}, {str(model.dtype).replace('torch.', '')}, {model.device}), trained on "
            f"{model.data_format} data" + (f" {fp}" if fp else ""))


def create_app(model: TrainedModel, max_batch: int = 64, max_wait_ms: float = 5.0, max_body_bytes: int = 1 << 20,
               rate_limit: float = 0.0, max_queue_points: int = 1_000_000, *,
               max_route_points: int = MAX_ROUTE_POINTS, max_request_points: int = 20_000,
               max_batch_points: int = 20_000, token: str | None = None, cors_origins: tuple[str, ...] = (),
               build_threads: int = 1, allowed_hosts: tuple[str, ...] | None = None, access_log: bool = True,
               checkpoint: str | None = None, precision: str | None = None, watch_s: float | None = None,
               version: str | None = None):
    """The ASGI app serving ``model`` (module docstring), which it replaces without a restart on ``POST
    /admin/reload`` (with a ``token`` only), on SIGHUP (:func:`serve`) and with ``watch_s`` (:mod:`.swap`).

    Args:
        max_batch: routes per forward pass; the oldest waiting request waits at most ``max_wait_ms`` for requests
            still being read and checked.
        max_body_bytes: larger bodies are refused (413).
        rate_limit: > 0: units of work per second per client address, a unit a request of up to 1,000 points
            (after densification; a larger one costs points / 1,000; charged on arrival by
            :func:`admission_units`, every path metered), past it 429; 0: no limit.
        max_queue_points: points that may wait for a pass (past it 429).
        max_route_points / max_request_points: points (after densification) per route / per request (413).
        max_batch_points: points per forward pass (a request of more goes alone); at least max_request_points.
        token: when given, every path but :data:`OPEN_PATHS` needs ``Authorization: Bearer <token>`` (401).
        cors_origins: browser origins allowed to call the API from another site (others: 403).
        allowed_hosts: the names (or addresses) the ``Host`` header may give, ports aside (others: 421); None: any.
        access_log: one line per request on the ``stfast.serve.access`` logger (:func:`access_line`).
        build_threads: worker threads that parse and check requests and build those of up to
            :data:`SMALL_REQUEST_POINTS` points (together, one batch at a time); larger ones are built in a thread of
            their own. One by default: these steps are Python under the GIL, and every extra thread taking turns
            with the forward pass's thread slows it (measured in docs/serve.md).
        checkpoint: the file a reload reads (default: the file ``model`` was loaded from); ``precision``: what a
            reloaded model computes in (None: its checkpoint's).
        watch_s: look at the checkpoint file's status every ``watch_s`` seconds and reload it when it changes
            (``--watch``); None: only on request.
        version: ``model``'s version (:func:`~.swap.load_versioned`'s); None: the SHA-256 of ``model.path`` now.

    ``app.state.reloader`` is the :class:`~.swap.Reloader` (its ``current`` model, ``swaps``, ``last_refusal``).
    """
    if max_batch_points < max_request_points or max_request_points < max_route_points:
        raise ValueError(f"the limits must nest: points per route ({max_route_points}) ≤ per request "
                         f"({max_request_points}) ≤ per batch ({max_batch_points})")
    # no CDN-served docs; no redirect of /eta/ to /eta (its Location would echo the client's Host header)
    reloader = Reloader(ServedModel.of(model, version), checkpoint or model.path, str(model.device), precision, watch_s)

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        reloader.start()
        yield
        await reloader.stop()

    app = FastAPI(title="stfast ETA", docs_url=None, redoc_url=None, openapi_url=None, redirect_slashes=False,
                  lifespan=lifespan)
    # no default model: every item carries its served model (a replaced one is freed once its requests are answered)
    batcher = route_batcher(None, max_batch, max_wait_ms / 1000.0, max_queue_points, max_batch_points)
    large = route_batcher(None, max_batch, 0.0, max_queue_points, max_batch_points, "stfast-forward-large")
    limit = RateLimit(rate_limit, max(rate_limit, 1.0)) if rate_limit > 0 else None
    page = resources.files(__package__).joinpath("page.html").read_text(encoding="utf-8")
    pool = ThreadPoolExecutor(build_threads, thread_name_prefix="stfast-build")  # parse, check, build
    heavy = ThreadPoolExecutor(1, thread_name_prefix="stfast-build-large")
    builder = DynamicBatcher(build_served, 1024, 0.0, max_queue_points,
                             max_batch_points=8 * SMALL_REQUEST_POINTS, padding=False, pool=pool)
    app.state.batcher, app.state.large_batcher, app.state.reloader = batcher, large, reloader
    stats = app.state.stats = {"abandoned": 0}  # requests whose client left before its answer

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc):  # 404, 405: the documented {"error": ...}
        words = {404: f"no such path: {request.url.path[:80]}; the API has POST /eta, GET /healthz, GET /coverage",
                 405: f"{request.method} is not allowed on {request.url.path[:80]}"}
        return json_response({"error": words.get(exc.status_code, str(exc.detail))}, exc.status_code,
                             getattr(exc, "headers", None))

    async def read_body(scope, receive) -> bytes:
        size = dict(scope["headers"]).get(b"content-length")
        if size is not None and size.isdigit() and int(size) > max_body_bytes:
            raise ApiError(413, f"request body of {int(size)} bytes, more than the limit of {max_body_bytes} bytes")
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Gone
            body += message.get("body", b"")
            if len(body) > max_body_bytes:
                raise ApiError(413, f"request body over the limit of {max_body_bytes} bytes")
            if not message.get("more_body", False):
                return bytes(body)

    def check(body: bytes, spacing_km: float):
        return check_body(parse_json(body), spacing_km=spacing_km, max_route_points=max_route_points,
                          max_request_points=max_request_points)

    async def answer(scope, receive, served: ServedModel) -> Response:
        """The answer of one POST /eta, all of it with ``served``: checked with its spacing, built with its route
        profile, predicted by it (its items carry it into the batcher)."""
        loop = asyncio.get_running_loop()
        body = await read_body(scope, receive)  # admitted: Service charged it from its Content-Length
        with batcher.arriving():  # from here it is on its way (a slow body does not hold batches back)
            # a body that can hold a large request is parsed beside the small ones, not before them
            reqs, many = await loop.run_in_executor(pool if len(body) <= LARGE_BODY_BYTES else heavy, check, body,
                                                    served.spacing_km)
            points = sum(r.points for r in reqs)
            if limit is not None and (wait := limit.top_up(client_of(scope), scope.get("stfast", {}).get("paid", 0.0),
                                                           max(1.0, points / POINTS_PER_UNIT))) > 0:
                raise rate_error(limit, wait)
            lane = batcher if points <= SMALL_REQUEST_POINTS else large
            lane.reserve(points)
            if points <= SMALL_REQUEST_POINTS:
                built = await builder.submit((served, reqs), len(reqs), points)
            else:
                built = (await loop.run_in_executor(heavy, build_items, served.model, [reqs]))[0]
            if isinstance(built, ApiError):
                raise built
            trips, pos = built
        lengths = trips.lengths[pos]
        job = asyncio.ensure_future(lane.submit((served, trips, pos), len(reqs), int(lengths.sum()), int(lengths.max()),
                                                scope.get("stfast")))
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait((job, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not job.done():  # the client went away: its request leaves the queue before its pass
                job.cancel()  # (cancelled() stays False until the loop has run the cancellation)
        if not job.done() or (gone.done() and not gone.cancelled()):
            raise _Gone  # its answer, if any, is discarded
        rows = job.result()
        # rounded to what the model can tell: 0.1 s and 1 m (float32 noise such as 711.2550048828125 is not data)
        out = [{"eta_s": round(float(t), 1), "km": round(float(d), 3), "points": int(n)} for t, d, n in rows.tolist()]
        return json_response({"etas": out, "model": served.version} if many else {**out[0], "model": served.version})

    async def eta(scope, receive, send):
        """POST /eta: a plain ASGI handler (no dependency solving, no response model), orjson both ways. The served
        model is read once, here: the request is answered by it (``model`` in the body, ``X-Model-Version``)."""
        served = reloader.current
        try:
            response = await answer(scope, receive, served)
        except ApiError as e:
            response = error_response(e)
        except QueueFull as e:
            response = error_response(ApiError(429, f"the service is busy: {e}", headers={"Retry-After": "1"}))
        except _Gone:  # nothing to answer: counted, and (in the access log) one line with status 499
            stats["abandoned"] += 1
            scope.setdefault("stfast", {})["status"] = 499
            return
        except Exception:
            log.exception("error answering POST /eta")
            response = error_response(ApiError(500, "internal error while answering this request; it was logged"))
        response.headers["X-Model-Version"] = served.version
        await response(scope, receive, send)

    async def eta_405(request: Request):  # FastAPI routes /eta too, so that a GET /eta gets its 405
        raise StarletteHTTPException(405)

    app.router.add_route("/eta", eta_405, methods=["POST"])

    @app.post("/admin/reload")
    async def admin_reload():
        """Reload the checkpoint file now (:meth:`Reloader.reload`): 200 swapped or unchanged, 409 refused (the
        running model keeps answering); 403 when the service has no token (``--token-file``)."""
        if token is None:
            return error_response(ApiError(403, "POST /admin/reload needs a service started with --token-file (send "
                                                "SIGHUP, or use --watch, to reload without one)"))
        result = await reloader.reload("POST /admin/reload")
        return json_response(result, 409 if result["outcome"] == "refused" else 200,
                             {"X-Model-Version": reloader.current.version})

    @app.get("/healthz")
    async def healthz():
        served = reloader.current  # once: every field below is of one model
        model, profile, spacing_km = served.model, served.profile, served.spacing_km
        cfg, mc = model.config, model.model
        inner = getattr(mc, "members", None)
        first = inner[0] if inner is not None else mc
        a = profile.area
        return {"status": "ok",
                "model": {"version": served.version, "parent": served.parent, "loaded_at": served.loaded_iso(),
                          "dtype": str(model.dtype).replace("torch.", ""), "precision": model.precision, "members": len(inner) if inner else 1,
                          "kernel_size": model.norm_stats.kernel_size, "hidden_size": first.cfg.hidden_size,
                          "known_drivers": len(model.drivers) - 1, "device": str(model.device)},
                "data": {"format": model.data_format, "time_zone": model.tz or cfg.tz,
                         "densify_spacing_km": spacing_km, "default_state": profile.state,
                         "training_points": profile.n_points,
                         "fingerprint": (model.data_fingerprint or "")[:12] or None},
                "coverage": {"rule": "a point is covered when a training point fell in its cell or a neighbouring "
                                     "one", "cell_km": a.cell_km, "margin_cells": a.margin_cells,
                             "cells": int(len(a.cells)), "bbox": list(a.bbox)},
                "batching": {"max_batch": batcher.max_batch, "max_wait_ms": batcher.max_wait_s * 1000.0,
                             "forward_passes": batcher.forward_passes + large.forward_passes,
                             "routes": batcher.routes + large.routes,
                             "forward_busy_s": round(batcher.busy_s + large.busy_s, 3),
                             "forward_cpu_s": round(batcher.busy_cpu_s + large.busy_cpu_s, 3),
                             "batch_wait_s": round(batcher.waited_s + large.waited_s, 3),
                             "build_busy_s": round(builder.busy_s, 3),
                             "queued_points": batcher.queued_points + large.queued_points},
                "requests": {"abandoned": stats["abandoned"]},
                "reload": {"swaps": reloader.swaps, "refusals": reloader.refusals,
                           "last_refusal": reloader.last_refusal,
                           "watch_s": reloader.watch_s, "admin": token is not None},
                "limits": {"max_body_bytes": max_body_bytes, "max_routes_per_request": MAX_ROUTES_PER_REQUEST,
                           "max_route_points": max_route_points, "max_request_points": max_request_points,
                           "max_batch_points": max_batch_points, "max_queue_points": max_queue_points,
                           "rate_limit_units_per_s": rate_limit or None, "points_per_unit": POINTS_PER_UNIT,
                           "token": token is not None}}

    @app.get("/coverage")
    async def coverage():
        return json_response(reloader.current.profile.area.to_dict())

    @app.get("/", response_class=HTMLResponse)
    async def index():
        return HTMLResponse(page, headers=PAGE_HEADERS)

    return Service(app, eta, token, tuple(cors_origins), allowed_hosts, access_log, limit, max_body_bytes)


class _Gone(Exception):
    """The client went away: nothing to answer."""


async def _disconnected(receive) -> None:
    """Returns when the client has gone (the server's ``receive`` gives ``http.disconnect``; after the body it
    waits for that, or for the response to be sent)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def serve(checkpoint: str, host: str = "127.0.0.1", port: int = 8000, max_batch: int = 64, max_wait_ms: float = 5.0,
          max_body_bytes: int = 1 << 20, rate_limit: float = 0.0, device: str = "cpu", *,
          forwarded_allow_ips: str | None = None, token_file: str | None = None, cors_origins: tuple[str, ...] = (),
          max_route_points: int = MAX_ROUTE_POINTS, max_request_points: int = 20_000, max_batch_points: int = 20_000,
          header_timeout_s: float = 10.0, body_timeout_s: float = 30.0, idle_timeout_s: float = 30.0,
          max_connections: int = 1000, drain_s: float = 30.0, precision: str | None = None,
          allowed_hosts: tuple[str, ...] = (), log_level: str = "info", access_log: bool = True,
          max_connections_per_client: int | None = None, write_timeout_s: float = 30.0, watch: bool = False) -> None:
    """Load ``checkpoint`` and serve it with uvicorn on ``host``:``port`` until interrupted (see :func:`create_app`).
    SIGHUP reloads ``checkpoint`` (:mod:`.swap`: loaded and checked in a thread, made current only when it passes);
    ``watch``: also whenever the file changes (its status looked at every second).

    uvicorn runs it with :mod:`.protocol`'s connection (header / body / write timeouts, connection caps in all and
    per client address, header limits, pipelining backpressure, JSON 503s when the drain ends), keep-alive
    connections idle longer than ``idle_timeout_s`` closed, ``X-Forwarded-For`` / ``-Proto`` honoured only from
    the addresses ``forwarded_allow_ips`` lists (None: from nowhere), and on SIGTERM / SIGINT a graceful drain:
    the listening socket closes, requests in flight are answered (for up to ``drain_s``), then the process exits.
    ``token_file``: a file whose first line is the bearer token every path but /healthz and / needs.
    ``precision``: what the forward passes compute in (32, 64 or bf16-mixed; None: the checkpoint's).
    ``allowed_hosts``: names the ``Host`` header may give, besides the defaults of :func:`default_hosts`.
    ``log_level``: debug, info, warning or error, of the service's log on stderr (the ready line and the access log
    are info); ``access_log``: one line per request (:func:`access_line`)."""
    from .swap import load_versioned

    setup_logging(log_level)
    sock = listening_socket(host, port)  # first: a port in use is said before the model is read

    token = None
    if token_file is not None:
        with open(token_file, encoding="utf-8") as f:
            token = f.readline().strip()
        if len(token) < 16:
            raise ValueError(f"{token_file}: the token must be at least 16 characters on the first line")
    model, version = load_versioned(checkpoint, device, precision)
    app = create_app(model, max_batch, max_wait_ms, max_body_bytes, rate_limit, max_route_points=max_route_points,
                     max_request_points=max_request_points, max_batch_points=max_batch_points, token=token,
                     cors_origins=cors_origins, allowed_hosts=default_hosts(host, allowed_hosts),
                     access_log=access_log, checkpoint=checkpoint, precision=precision,
                     watch_s=WATCH_INTERVAL_S if watch else None, version=version)
    config = server_config(app, host, port, forwarded_allow_ips=forwarded_allow_ips, header_timeout_s=header_timeout_s,
                           body_timeout_s=body_timeout_s, idle_timeout_s=idle_timeout_s,
                           max_connections=max_connections, drain_s=drain_s, log_level=log_level,
                           max_connections_per_client=max_connections_per_client, write_timeout_s=write_timeout_s)
    ReadyServer(config, describe(model)).run(sockets=[sock])


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (``host``, ``port``) for uvicorn (as its own binding does: SO_REUSEADDR, IPv6 for an
    address with a colon). Raises ValueError naming the flags: the port in use by another program (uvicorn's own
    message was a raw ``[Errno 98]`` log line and exit 3), or no such address here."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise ValueError(f"--port {port}: {host}:{port} is in use by another program (another stfast serve?); "
                             "give another --port, or stop that program") from None
        raise ValueError(f"--host {host} --port {port}: cannot listen there: {e.strerror or e}") from None
    sock.set_inheritable(True)
    return sock


LOG_LEVELS = ("debug", "info", "warning", "error")


def setup_logging(level: str) -> None:
    """The service's log (logger ``stfast.serve`` and below) on stderr at ``level``: one line per record with its
    time and level."""
    if level not in LOG_LEVELS:
        raise ValueError(f"log level {level!r}: choose one of {', '.join(LOG_LEVELS)}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%Y-%m-%dT%H:%M:%S"))
    root = logging.getLogger("stfast.serve")
    root.handlers = [handler]
    root.setLevel(level.upper())
    root.propagate = False  # the CLI's "stfast" handler would print each line twice


class ReadyServer(uvicorn.Server):
    """uvicorn's server, saying where it listens and what it serves once it does (the ready line, logged on
    ``stfast.serve`` at info). When the app has a reloader (``app.state.reloader``, :func:`create_app`'s) and it runs
    in the main thread, SIGHUP reloads the model (a SIGHUP that came while it started reloads once it has)."""

    def __init__(self, config: uvicorn.Config, model_line: str):
        super().__init__(config)
        self.model_line = model_line
        reloader = self.reloader = getattr(getattr(config.app, "state", None), "reloader", None)
        self._early_hup = False
        if reloader is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGHUP, self._hup_before_start)  # not the default: SIGHUP ends a process

    def _hup_before_start(self, signum, frame) -> None:
        self._early_hup = True

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if not self.started:
            return
        if self.reloader is not None and threading.current_thread() is threading.main_thread():
            loop = asyncio.get_running_loop()
            loop.add_signal_handler(signal.SIGHUP, self.reloader.trigger, "SIGHUP")
            if self._early_hup:
                self.reloader.trigger("SIGHUP")
        cfg = self.config
        port = self.servers[0].sockets[0].getsockname()[1] if self.servers and self.servers[0].sockets else cfg.port
        host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
        log.info("stfast serve: ready on http://%s:%d, model %s (Ctrl+C stops; SIGTERM drains up to %g s)", host,
                 port, self.model_line, cfg.timeout_graceful_shutdown)


def server_config(app, host: str = "127.0.0.1", port: int = 8000, *, forwarded_allow_ips: str | None = None,
                  header_timeout_s: float = 10.0, body_timeout_s: float = 30.0, idle_timeout_s: float = 30.0,
                  max_connections: int = 1000, drain_s: float = 30.0, log_level: str = "info",
                  max_connections_per_client: int | None = None, write_timeout_s: float = 30.0):
    """The ``uvicorn.Config`` :func:`serve` runs ``app`` with (its docstring says what each limit does). uvicorn's
    own log stays at warning unless ``log_level`` is debug or above warning (the ready line and the access log are
    the service's own); its access log is off."""
    from .protocol import protocol_class

    return uvicorn.Config(app, host=host, port=port, log_level=log_level if log_level in ("debug", "error") else "warning",
                          access_log=False,
                          http=protocol_class(header_timeout_s, body_timeout_s, max_connections,
                                              max_per_client=max_connections_per_client,
                                              write_timeout_s=write_timeout_s, forwarded_allow_ips=forwarded_allow_ips),
                          timeout_keep_alive=idle_timeout_s, timeout_graceful_shutdown=drain_s,
                          proxy_headers=bool(forwarded_allow_ips), forwarded_allow_ips=forwarded_allow_ips or "",
                          server_header=False)
