"""The Celery side: app configuration, lane discovery checks, per-process runtime, the
``FairScheduler`` that carries out the core's tick plan, and ``LaneTask`` on the workers.
Imports the core and the Redis side."""
