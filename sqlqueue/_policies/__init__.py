"""What an app declares about when its jobs run: retry schedules (``backoff``), rate limits
and circuit breakers (``rate_limit``, ``circuit_breaker``, and the key both gate on,
``gatekey``), how long finished jobs are kept (``retention``) and periodic schedules
(``periodic``). Plain values, checked when declared; the worker and the store enforce them."""
