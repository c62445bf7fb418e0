"""The pure decision core: lane declarations as values, records and their codec, views, gates,
deferral rules, the picker, the pipeline, the tick planner, the run lifecycle and health.

Nothing here touches Redis, Celery or a clock: every function takes the state and ``now`` as
arguments. A test (``tests/test_architecture.py``) imports every module of this package in a
fresh interpreter and fails if celery, kombu, billiard, redis, pydantic or sentry_sdk loaded.
"""
