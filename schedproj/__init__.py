"""schedproj: a fair Celery Beat scheduler for periodic maintenance lanes.

Declare a lane::

    from schedproj import Lane, LaneKind, LaneTask

    @app.task(base=LaneTask, bind=True, lane=Lane(cadence_s=600, kind=LaneKind.HEAVY))
    def summary(self): ...
"""

from schedproj.config import configure_app, create_app
from schedproj.errors import (
    BeatLockLost,
    ConfigurationError,
    LaneDeclarationError,
    LeaseLost,
    SchedprojError,
    StateError,
)
from schedproj.lanes import DeferralReason, DeploymentClass, Gate, GateCondition, Lane, LaneKind
from schedproj.picker import Policy
from schedproj.settings import Profile, Settings
from schedproj.task import LaneTask, current_run

__all__ = [
    "BeatLockLost",
    "ConfigurationError",
    "DeferralReason",
    "DeploymentClass",
    "Gate",
    "GateCondition",
    "Lane",
    "LaneDeclarationError",
    "LaneKind",
    "LaneTask",
    "LeaseLost",
    "Policy",
    "Profile",
    "SchedprojError",
    "Settings",
    "StateError",
    "configure_app",
    "create_app",
    "current_run",
]
