"""Operations: the command line, status, Prometheus metrics, Sentry and the starvation
watchdog. Imports any layer below it; nothing below imports it (except the Celery side's
start-up hooks for Sentry and metrics)."""
