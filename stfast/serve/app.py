"""The ETA service: an ASGI app (FastAPI) over a :class:`~stfast.train.trained.TrainedModel`.

Endpoints:

* ``POST /eta`` with ``{"route": [[lng, lat], ...], "departure": "2016-11-01T08:30:00+08:00", "driver": ...,
  "states": [...], "densify": true}`` → ``{"eta_s": ..., "km": ..., "points": ...}`` (the number
  :meth:`TrainedModel.eta` gives; ``km`` the route's length, ``points`` what the model read after
  densification); ``{"routes": [{...}, ...]}`` → ``{"etas": [{...}, ...]}`` in the order given.
* ``GET /healthz``: status, model and data summary, the training area's extent, batching counters. It
  names no file or folder.
* ``GET /coverage``: the training area's occupied cells (what the page draws).
* ``GET /``: a self-contained page (no external resources) to click or paste a route and see its ETA.

Errors are JSON ``{"error": ..., "route": i, "field": ...}``: 400 a body that is not JSON, 413 a body over the
limit, too many routes or a route over 10,000 points, 422 a request that is JSON but wrong (a missing or unknown
key, a bad route, a point outside the training area, an unparsable departure), 429 over the per-client rate
limit or a full queue (with ``Retry-After``). A request names no file: the service reads the checkpoint once at
start and nothing a request sends reaches the file system.
"""
from __future__ import annotations

import json
import math
from importlib import resources

import numpy as np
import orjson
from fastapi import FastAPI, Request  # module level: FastAPI resolves the handlers' annotations here
from fastapi.responses import HTMLResponse, Response

from ..data.routes import RouteError
from ..data.trips import Trips
from ..train.trained import TrainedModel
from .batcher import DynamicBatcher, QueueFull
from .ratelimit import RateLimit

ROUTE_KEYS = {"route", "departure", "driver", "states", "densify"}
MAX_ROUTES_PER_REQUEST = 1000


class ApiError(Exception):
    """An error answer: HTTP ``status`` and the JSON body's fields."""

    def __init__(self, status: int, error: str, route: int | None = None, field: str | None = None,
                 headers: dict | None = None):
        super().__init__(error)
        self.status, self.error, self.route, self.field, self.headers = status, error, route, field, headers

    def body(self) -> dict:
        return {"error": self.error, **({} if self.route is None else {"route": self.route}),
                **({} if self.field is None else {"field": self.field})}

    def response(self) -> Response:
        return json_response(self.body(), self.status, self.headers)


def json_response(obj, status: int = 200, headers: dict | None = None) -> Response:
    """``obj`` as a JSON response, encoded once by orjson."""
    return Response(orjson.dumps(obj), status, headers, media_type="application/json")


def parse_json(body: bytes):
    """The request body as Python objects. orjson first (a sixth of the stdlib's time on a route of 33 points);
    what only the stdlib reads (``NaN`` / ``Infinity`` literals, numbers past a double's range, UTF-16/32 text) is
    read by ``json`` as before, so the route checks, not the parser, answer for it. orjson reads an integer past
    64 bits as a float, which the driver check refuses (422). Raises ApiError 400."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        try:
            return json.loads(body)
        except (ValueError, UnicodeDecodeError) as e:
            raise ApiError(400, f"the body is not JSON: {e}") from None


def _route_trips(model: TrainedModel, reqs: list[dict]) -> tuple[Trips, np.ndarray]:
    """Checked route requests (:func:`_route_request`) as one Trips, one :meth:`TrainedModel.route_trips` call per
    ``densify`` setting (a call for 64 routes costs a third of 64 calls of one), and ``pos`` [len(reqs)]: each
    request's row in it. Raises RouteError (its index: the position among ``reqs`` of its ``densify`` group, so
    callers that need a request's own index check one route at a time) or TypeError."""
    groups: dict[bool, list[int]] = {}
    for i, r in enumerate(reqs):
        groups.setdefault(r.get("densify", True), []).append(i)
    parts, order = [], []
    for densify, idx in groups.items():
        rs = [reqs[i] for i in idx]
        states = [r.get("states") for r in rs]
        parts.append(model.route_trips([r["route"] for r in rs], [r["departure"] for r in rs],
                                       [r.get("driver") for r in rs],
                                       None if all(x is None for x in states) else states, densify))
        order += idx
    pos = np.empty(len(reqs), np.int64)
    pos[order] = np.arange(len(reqs))
    return (parts[0] if len(parts) == 1 else Trips.concat(parts)), pos


def _request_error(model: TrainedModel, reqs: list[dict]) -> ApiError | None:
    """The error of one request's first bad route, naming its index in the request and the field; None if none."""
    for i, r in enumerate(reqs):  # one at a time: an error names the route's place in this request
        try:
            _route_trips(model, [r])
        except RouteError as e:
            return ApiError(413 if e.too_large else 422, e.problem, i, e.field)
        except TypeError as e:
            return ApiError(422, str(e), i)
    return None


def route_batcher(model: TrainedModel, max_batch: int, max_wait_s: float, max_queue: int = 100_000) -> DynamicBatcher:
    """The service's :class:`DynamicBatcher`. An item is one request: its list of checked route requests
    (:func:`_route_request`). When a batch is about to run, its routes are built in the event loop as one Trips
    (checks, densification, distances, calendar ids: :meth:`TrainedModel.route_trips`), once per batch rather than
    once per route; a request with a bad route gets its :class:`ApiError` (413/422 naming its route index and
    field) and the rest run without it. The pass (one ``predict``, passes of at most ``max_batch`` routes) runs in
    the worker thread. Each request's result: [n_i, 3] float64 rows of (eta_s, km, points)."""

    def prepare(items: list[list[dict]]):
        reqs = [r for item in items for r in item]
        try:
            trips, pos = _route_trips(model, reqs)
            return (trips, pos, [len(item) for item in items]), {}
        except (RouteError, TypeError):
            pass
        errors = {k: e for k, item in enumerate(items) if (e := _request_error(model, item)) is not None}
        good = [item for k, item in enumerate(items) if k not in errors]
        if not good:
            return None, errors
        trips, pos = _route_trips(model, [r for item in good for r in item])
        return (trips, pos, [len(item) for item in good]), errors

    def forward(batch) -> list[np.ndarray]:
        trips, pos, counts = batch
        secs = model.predict(trips, batch_size=max_batch)
        rows = np.stack([secs[pos], trips.dist[pos], trips.lengths[pos].astype(np.float64)], 1)
        return np.split(rows, np.cumsum(counts)[:-1])

    return DynamicBatcher(forward, max_batch, max_wait_s, max_queue, prepare)


def _route_request(obj, index: int) -> dict:
    if not isinstance(obj, dict):
        raise ApiError(422, f"expected a JSON object with route and departure, got {type(obj).__name__}", index)
    unknown = sorted(set(obj) - ROUTE_KEYS)
    if unknown:
        raise ApiError(422, f"unknown key {unknown[0]!r}; a route has {', '.join(sorted(ROUTE_KEYS))}", index,
                       unknown[0])
    for key in ("route", "departure"):
        if key not in obj:
            raise ApiError(422, f"missing {key!r}", index, key)
    if not isinstance(obj["route"], list):
        raise ApiError(422, "expected a list of [lng, lat] pairs", index, "route")
    if "densify" in obj and not isinstance(obj["densify"], bool):
        raise ApiError(422, "expected true or false", index, "densify")
    if obj.get("driver") is not None and not isinstance(obj["driver"], (str, int)):
        # orjson reads an integer past 64 bits as a float: such an id is refused here, not rounded to another id
        raise ApiError(422, "expected a string or an integer within 64 bits (send a larger id as a string)", index,
                       "driver")
    return obj


class EtaFirst:
    """The service's ASGI app: ``POST /eta`` goes straight to its handler, every other request (the page, health,
    coverage, 404 and 405) to the FastAPI app. FastAPI's middleware stack and router cost about 0.1 ms of CPU per
    request, a fifth of what the whole /eta path spends besides the forward pass (docs/serve.md). ``state`` is
    the FastAPI app's (``state.batcher``)."""

    def __init__(self, app: FastAPI, eta):
        self.app, self.eta, self.state = app, eta, app.state

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] == "/eta" and scope["method"] == "POST":
            response = await self.eta(Request(scope, receive))
            await response(scope, receive, send)
        else:
            await self.app(scope, receive, send)


def create_app(model: TrainedModel, max_batch: int = 64, max_wait_ms: float = 5.0, max_body_bytes: int = 1 << 20,
               rate_limit: float = 0.0, max_queue: int = 100_000):
    """The ASGI app serving ``model`` (module docstring): FastAPI, with ``POST /eta`` taken first (:class:`EtaFirst`).
    ``max_batch`` routes per forward pass, the oldest waiting request waits at most ``max_wait_ms`` for company;
    bodies over ``max_body_bytes`` are refused (413); ``rate_limit`` > 0: requests per second per client address
    (429 past it); ``max_queue`` routes may wait."""
    app = FastAPI(title="stfast ETA", docs_url=None, redoc_url=None, openapi_url=None)  # no CDN-served docs
    batcher = route_batcher(model, max_batch, max_wait_ms / 1000.0, max_queue)
    limit = RateLimit(rate_limit) if rate_limit > 0 else None
    profile = model.route_defaults()
    page = resources.files(__package__).joinpath("page.html").read_text(encoding="utf-8")
    app.state.batcher = batcher

    async def read_json(request: Request):
        if limit is not None:
            wait = limit.allow(request.client.host if request.client else "?")
            if wait > 0:
                raise ApiError(429, f"rate limit: at most {rate_limit:g} requests/s per client", None, None,
                               {"Retry-After": str(max(1, math.ceil(wait)))})
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > max_body_bytes:
            raise ApiError(413, f"request body of {size} bytes, more than the limit of {max_body_bytes}")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > max_body_bytes:
                raise ApiError(413, f"request body over the limit of {max_body_bytes} bytes")
        return parse_json(bytes(body))

    async def eta(request: Request) -> Response:
        """POST /eta: a plain Starlette handler (no dependency solving, no response model), orjson both ways. The
        FastAPI app also routes it (a GET /eta gets FastAPI's 405)."""
        try:
            return await eta_answer(request)
        except ApiError as e:
            return e.response()

    async def eta_answer(request: Request) -> Response:
        obj = await read_json(request)
        if not isinstance(obj, dict):
            raise ApiError(422, "expected a JSON object: {\"route\": ..., \"departure\": ...} or {\"routes\": [...]}")
        many = "routes" in obj
        if many:
            extra = sorted(set(obj) - {"routes"})
            if extra:
                raise ApiError(422, f"unknown key {extra[0]!r} beside 'routes'", None, extra[0])
            if not isinstance(obj["routes"], list) or not obj["routes"]:
                raise ApiError(422, "'routes' must be a non-empty list", None, "routes")
            if len(obj["routes"]) > MAX_ROUTES_PER_REQUEST:
                raise ApiError(413, f"{len(obj['routes'])} routes, more than {MAX_ROUTES_PER_REQUEST} per request",
                               None, "routes")
            reqs = [_route_request(r, i) for i, r in enumerate(obj["routes"])]
        else:
            reqs = [_route_request(obj, 0)]
        try:
            rows = await batcher.submit(reqs, len(reqs))
        except QueueFull as e:
            raise ApiError(429, f"the service is busy: {e}", headers={"Retry-After": "1"}) from None
        out = [{"eta_s": float(t), "km": float(d), "points": int(n)} for t, d, n in rows.tolist()]
        return json_response({"etas": out} if many else out[0])

    app.router.add_route("/eta", eta, methods=["POST"])

    @app.get("/healthz")
    async def healthz():
        cfg, mc = model.config, model.model
        inner = getattr(mc, "members", None)
        first = inner[0] if inner is not None else mc
        a = profile.area
        return {"status": "ok",
                "model": {"dtype": str(model.dtype).replace("torch.", ""), "members": len(inner) if inner else 1,
                          "kernel_size": model.norm_stats.kernel_size, "hidden_size": first.cfg.hidden_size,
                          "known_drivers": len(model.drivers) - 1, "device": str(model.device)},
                "data": {"format": cfg.format if cfg.data else "synthetic", "time_zone": model.tz or cfg.tz,
                         "densify_spacing_km": model.densify_spacing_km(), "default_state": profile.state,
                         "training_points": profile.n_points,
                         "fingerprint": (model.data_fingerprint or "")[:12] or None},
                "coverage": {"rule": "a point is covered when a training point fell in its cell or a neighbouring "
                                     "one", "cell_km": a.cell_km, "margin_cells": a.margin_cells,
                             "cells": int(len(a.cells)), "bbox": list(a.bbox)},
                "batching": {"max_batch": batcher.max_batch, "max_wait_ms": batcher.max_wait_s * 1000.0,
                             "forward_passes": batcher.forward_passes, "routes": batcher.routes},
                "limits": {"max_body_bytes": max_body_bytes, "max_routes_per_request": MAX_ROUTES_PER_REQUEST,
                           "rate_limit_per_s": rate_limit or None}}

    @app.get("/coverage")
    async def coverage():
        return profile.area.to_dict()

    @app.get("/", response_class=HTMLResponse)
    async def index():
        return HTMLResponse(page)

    return EtaFirst(app, eta)


def serve(checkpoint: str, host: str = "127.0.0.1", port: int = 8000, max_batch: int = 64, max_wait_ms: float = 5.0,
          max_body_bytes: int = 1 << 20, rate_limit: float = 0.0, device: str = "cpu") -> None:
    """Load ``checkpoint`` and serve it with uvicorn on ``host``:``port`` until interrupted (see :func:`create_app`)."""
    import uvicorn

    from ..train.trained import load_model

    model = load_model(checkpoint, device)
    app = create_app(model, max_batch, max_wait_ms, max_body_bytes, rate_limit)
    # keep-alive 30 s (uvicorn's default is 5): a client waiting on a busy queue keeps its connection
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False, timeout_keep_alive=30)
