"""The public home of the fair scheduler: ``celery beat -S fair`` (the ``fair`` entry point)
and ``beat_scheduler = "schedproj.scheduler:FairScheduler"`` name this module, as DESIGN.md
promises; the implementation lives on the Celery side, :mod:`schedproj.on_celery.beat`."""

from schedproj.on_celery.beat import FairScheduler

__all__ = ["FairScheduler"]
