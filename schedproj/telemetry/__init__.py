"""Telemetry: what beat and the tools show about the fleet — Sentry, Prometheus metrics, the
observation of durable state, the status report, the status page and its web server.

It reads Redis through the store and imports only the layers below the Celery side (core,
store, settings), so the Celery side may start it without importing anything above itself."""
