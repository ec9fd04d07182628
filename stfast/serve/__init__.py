"""``stfast serve``: the ETA of planned routes over HTTP (FastAPI + uvicorn + orjson, the ``stfast[serve]`` extra).

:mod:`.batcher` gathers concurrent requests into one forward pass (dynamic batching), :mod:`.ratelimit`
is the optional per-client rate limit, :mod:`.app` the ASGI application (``POST /eta``, ``GET /healthz``,
``GET /coverage``, the page at ``GET /``) and :func:`.app.serve` runs it under uvicorn. The layer sits
above :mod:`stfast.train` (it serves a :class:`~stfast.train.trained.TrainedModel`) and below the CLI.
"""
