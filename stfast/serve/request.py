"""An ``/eta`` request body → checked route requests, or the :class:`ApiError` that answers it.

Everything here runs before a request joins a batch (in a worker thread, off the event loop: a 1 MiB body
takes milliseconds to read and check), so a request that reaches the batcher can only fail through a fault of
ours. Limits are checked before the costly steps: the body's nesting depth before it is parsed, every route's
point count after densification (estimated from its length) before it is densified.

The rules (docs/serve.md, "What a request may hold"):

* the body: JSON (UTF-8, or UTF-16/32 with or without BOM), nested at most :data:`MAX_DEPTH` deep;
* numbers are JSON numbers: a coordinate, state or departure sent as text (``"104.06"``) or ``true`` is refused;
  a number beyond a double's range is not finite (``1`` followed by 400 zeros is refused as ``1e400`` is);
* a driver id is text of 1–256 characters or an integer in [-2^63, 2^63); anything else (a fraction, a larger
  integer, ``true``) is refused: send a larger id as text;
* a route has 2 or more [lng, lat] points and a length above 0 km; at most ``max_route_points`` points as given
  and after densification, at most ``max_request_points`` over the request's routes (413 naming the limit);
* error texts quote at most 60 characters of what the client sent, with characters JSON cannot carry (a lone
  surrogate) escaped.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import orjson

from ..data.geo import EARTH_RADIUS_KM, haversine_km
from ..data.routes import RouteError, check_route

ROUTE_KEYS = ("route", "departure", "driver", "states", "densify")
MAX_ROUTES_PER_REQUEST = 1000
MAX_DEPTH = 16
"""The deepest nesting a body may have: a request needs 5 (``{"routes": [{"route": [[lng, lat]]}]}``)."""
MAX_DRIVER_CHARS = 256
_NUMBER = (int, float)
_INT64 = (-(1 << 63), 1 << 63)


class ApiError(Exception):
    """An error answer: HTTP ``status`` and the JSON body's fields (``error``, and ``route`` / ``field`` when they
    apply); ``headers`` extra response headers."""

    def __init__(self, status: int, error: str, route: int | None = None, field: str | None = None,
                 headers: dict | None = None):
        super().__init__(error)
        self.status, self.error, self.route, self.field, self.headers = status, error, route, field, headers

    def body(self) -> dict:
        return {"error": self.error, **({} if self.route is None else {"route": self.route}),
                **({} if self.field is None else {"field": self.field})}


def quote(value, limit: int = 60) -> str:
    """``value`` as an error text may show it: in JSON's words (``null``, ``true``, ``"text"``, ``[1, 2]``; non-ASCII
    escaped, so a lone surrogate cannot break the answer's encoding), cut to ``limit`` characters."""
    try:
        s = json.dumps(value, ensure_ascii=True, default=str)
    except ValueError:  # an integer of more digits than Python converts
        s = "a number too long to show"
    return s if len(s) <= limit else s[:limit - 1] + "…"


def json_depth(body: bytes) -> int:
    """The deepest nesting of arrays and objects in UTF-8 JSON text ``body`` (brackets inside strings not counted),
    computed with numpy at memory speed, so a body nested 100,000 deep is refused before a parser recurses."""
    b = body.replace(b"\\\\", b"").replace(b'\\"', b"")  # what remains of '"' delimits strings
    a = np.frombuffer(b, np.uint8)
    if not len(a):
        return 0
    outside = (np.cumsum(a == 34) & 1) == 0
    step = ((a == 91) | (a == 123)).astype(np.int32) - ((a == 93) | (a == 125))
    return int(np.cumsum(step * outside).max(initial=0))


def _parse_int(text: str):
    # the stdlib reads any integer exactly (and refuses one of 4,300+ digits with a message about sys); past 40
    # digits no id or coordinate is meant: read it as a double, as orjson does (inf past a double's range)
    return int(text) if len(text) <= 40 else float(text)


def parse_json(body: bytes):
    """The request body as Python objects. orjson reads UTF-8; UTF-16/32 text is transcoded first; what only the
    stdlib reads (``NaN`` / ``Infinity`` literals, a lone surrogate escape, numbers past a double's range) is read
    by ``json`` with integers of more than 40 digits as doubles, so the route checks, not the parser, answer for
    it. Raises ApiError 400 (not JSON, or nested deeper than :data:`MAX_DEPTH`)."""
    try:
        enc = json.detect_encoding(body)
        if enc not in ("utf-8", "utf-8-sig"):
            body = body.decode(enc).encode("utf-8", "surrogatepass")
        elif body[:3] == b"\xef\xbb\xbf":
            body = body[3:]
    except UnicodeError:
        raise ApiError(400, "the body is not JSON: it is not UTF-8, UTF-16 or UTF-32 text") from None
    depth = json_depth(body)
    if depth > MAX_DEPTH:
        raise ApiError(400, f"the body is not a request: JSON nested {depth} deep, more than the limit of "
                            f"{MAX_DEPTH}")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(body, parse_int=_parse_int)
    except json.JSONDecodeError as e:
        raise ApiError(400, f"the body is not JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except (ValueError, UnicodeError, RecursionError):
        raise ApiError(400, "the body is not JSON") from None


@dataclass
class Checked:
    """One checked route request: its fields as the model takes them and its size."""

    route: np.ndarray  # [n, 2] float64 (lng, lat) degrees
    departure: object  # str or a number (Unix seconds)
    driver: object  # str, int or None
    states: np.ndarray | None  # [n] float64 0/1, or None
    densify: bool
    points: int  # what the model reads: n, or the estimate after densification (exact within a few points)


def _number(v) -> bool:
    return type(v) in _NUMBER  # bool is an int subclass: type(), not isinstance()


MIN_ROUTE_KM = 0.001  # a route shorter than a metre goes nowhere: no travel time to estimate


def _densified_path_km(a: np.ndarray) -> float:
    """Length (km) of the path densification walks through route ``a`` [n, 2] (lng, lat degrees): per segment the
    larger of its great-circle length and the length of the straight line in (lng, lat) between its ends, the
    line the densifier interpolates along. Why both: a segment across the antimeridian (179.99 to -179.99) is
    2 km as the crow flies but interpolated the long way round the globe; its point estimate must see that."""
    lng, lat = a[:, 0], a[:, 1]
    great = haversine_km(lng[:-1], lat[:-1], lng[1:], lat[1:])
    coslat = np.cos(np.radians((lat[:-1] + lat[1:]) / 2))
    straight = np.hypot(np.diff(lng) * coslat, np.diff(lat)) * (np.pi / 180.0 * EARTH_RADIUS_KM)
    return float(np.maximum(great, straight).sum())


def check_request(obj, index: int, *, spacing_km: float, max_route_points: int) -> Checked:
    """One route request (``index``: its place in the request) checked as the module docstring says, before any
    densification. Raises ApiError: 422 naming the field, 413 naming the limit."""
    if not isinstance(obj, dict):
        raise ApiError(422, f"expected a JSON object with route and departure, got {_json_type(obj)}", index)
    for k in obj:
        if k not in ROUTE_KEYS:
            raise ApiError(422, f"unknown key {quote(k)}; a route has {', '.join(sorted(ROUTE_KEYS))}", index,
                           quote(k, 60)[1:-1] if isinstance(k, str) else None)
    for key in ("route", "departure"):
        if key not in obj:
            raise ApiError(422, f"missing {key!r}", index, key)
    route = obj["route"]
    if not isinstance(route, list):
        raise ApiError(422, f"expected a list of [lng, lat] pairs of numbers, got {_json_type(route)}", index, "route")
    if len(route) > max_route_points:
        raise ApiError(413, f"{len(route)} points, more than the limit of {max_route_points} points per route",
                       index, "route")
    if len(route) < 2:
        raise ApiError(422, f"a route needs at least 2 [lng, lat] points, got {len(route)}", index, "route")
    if not all(type(p) is list and len(p) == 2 and _number(p[0]) and _number(p[1]) for p in route):
        j = next(j for j, p in enumerate(route)
                 if not (type(p) is list and len(p) == 2 and _number(p[0]) and _number(p[1])))
        raise ApiError(422, f"point {j} is not a [lng, lat] pair of numbers: {quote(route[j])}", index, "route")
    try:
        a = check_route(route, index, max_route_points)  # finite, in range
    except RouteError as e:
        raise ApiError(413 if e.too_large else 422, e.problem, index, e.field) from None
    dep = obj["departure"]
    if not (isinstance(dep, str) or _number(dep)):
        raise ApiError(422, f"expected an ISO-8601 time such as 2016-11-01T08:30:00+08:00 or Unix seconds, got "
                            f"{_json_type(dep)}", index, "departure")
    if isinstance(dep, str) and len(dep) > 64:
        raise ApiError(422, f"not an ISO-8601 time (such as 2016-11-01T08:30:00+08:00): {quote(dep)}", index,
                       "departure")
    driver = obj.get("driver")
    if driver is not None and not (
            (isinstance(driver, str) and 0 < len(driver) <= MAX_DRIVER_CHARS)
            or (type(driver) is int and _INT64[0] <= driver < _INT64[1])):
        raise ApiError(422, f"expected a driver id: text of 1 to {MAX_DRIVER_CHARS} characters or an integer in "
                            f"[-2^63, 2^63) (send a larger id as text), got {_json_type(driver)}", index, "driver")
    densify = obj.get("densify", True)
    if type(densify) is not bool:
        raise ApiError(422, f"expected true or false, got {_json_type(densify)}", index, "densify")
    states = obj.get("states")
    if states is not None:
        if not isinstance(states, list) or len(states) != len(a):
            n = len(states) if isinstance(states, list) else _json_type(states)
            raise ApiError(422, f"expected one 0 or 1 per point ({len(a)} points), got {n}", index, "states")
        bad = next((j for j, s in enumerate(states) if not (_number(s) and s in (0, 1))), None)
        if bad is not None:
            raise ApiError(422, f"value {quote(states[bad])} at point {bad}: states are the numbers 0 or 1", index,
                           "states")
        states = np.asarray(states, np.float64)
    km = _densified_path_km(a)
    if km < MIN_ROUTE_KM:
        raise ApiError(422, f"the route's {len(a)} points are {km * 1000:.2g} m long in all: a route must go somewhere (at "
                            f"least {MIN_ROUTE_KM * 1000:g} m)",
                       index, "route")
    points = int(km / spacing_km) + 2 if densify else len(a)
    if points > max_route_points:
        raise ApiError(413, f"densified to the training spacing of {spacing_km:g} km ({km:.1f} km) the route would "
                            f"have about {points} points, more than the limit of {max_route_points} points per route",
                       index, "route")
    return Checked(a, dep, driver, states, densify, points)


def check_body(obj, *, spacing_km: float, max_route_points: int, max_request_points: int,
               max_routes: int = MAX_ROUTES_PER_REQUEST) -> tuple[list[Checked], bool]:
    """A parsed body → (its checked route requests, whether it was the ``{"routes": [...]}`` form). Raises
    ApiError: 422 naming the route and field, 413 naming the limit (routes per request, points per route, points
    per request)."""
    if not isinstance(obj, dict):
        raise ApiError(422, 'expected a JSON object: {"route": ..., "departure": ...} or {"routes": [...]}')
    many = "routes" in obj
    if many:
        for k in obj:
            if k != "routes":
                raise ApiError(422, f"unknown key {quote(k)} beside 'routes'", None, quote(k, 60)[1:-1])
        routes = obj["routes"]
        if not isinstance(routes, list) or not routes:
            raise ApiError(422, "'routes' must be a non-empty list", None, "routes")
        if len(routes) > max_routes:
            raise ApiError(413, f"{len(routes)} routes, more than the limit of {max_routes} routes per request",
                           None, "routes")
    else:
        routes = [obj]
    out, total = [], 0
    for i, r in enumerate(routes):
        c = check_request(r, i, spacing_km=spacing_km, max_route_points=max_route_points)
        total += c.points
        if total > max_request_points:
            raise ApiError(413, f"routes 0 to {i} hold about {total} points (after densification), more than the "
                                f"limit of {max_request_points} points per request", i, "route")
        out.append(c)
    return out, many


def _json_type(v) -> str:
    """The JSON name of a parsed value's type (the API's words, not Python's)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return f"the number {quote(v)}" if not (isinstance(v, float) and not math.isfinite(v)) else "a number out " \
                                                                                                   "of range"
    if isinstance(v, str):
        return f"the text {quote(v)}"
    return "a list" if isinstance(v, list) else "an object"
