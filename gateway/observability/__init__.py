"""What the operator sees: Prometheus metrics (``metrics``, ``metric_values``), OpenTelemetry spans and
tracer (``spans``, ``telemetry``), the access log (``access``) and who may read the gateway's own
endpoints (``exposure``). Imports ``config`` and ``http``."""
