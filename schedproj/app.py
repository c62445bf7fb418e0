"""The Celery app behind the public commands::

    celery -A schedproj.app worker -Q heavy -c 1
    celery -A schedproj.app worker -Q light
    celery -A schedproj.app beat -S fair

Lanes are imported from the modules named in ``SCHEDPROJ_LANE_MODULES``.
"""

from __future__ import annotations

from schedproj.ops.apps import create_app

app = create_app()
