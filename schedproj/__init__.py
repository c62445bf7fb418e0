"""schedproj: a fair Celery Beat scheduler for periodic maintenance lanes.

Declare a lane::

    from schedproj import Lane, LaneKind, LaneTask

    @app.task(base=LaneTask, bind=True, lane=Lane(cadence_s=600, kind=LaneKind.HEAVY))
    def summary(self): ...

The declaration values come from the pure core and load nothing else. The names that need
Celery or pydantic (``LaneTask``, ``configure_app``, ``Settings``, ...) load on first use, so
``import schedproj.core...`` stays free of them (tests/test_architecture.py checks it).
"""

from __future__ import annotations

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from schedproj.core.errors import (
    BeatLockLost,
    ConfigurationError,
    LaneDeclarationError,
    LeaseLost,
    SchedprojError,
    StateError,
)
from schedproj.core.lanes import (
    DeferralReason,
    DeploymentClass,
    DueAnswer,
    DueCheckStamp,
    Gate,
    GateCondition,
    Lane,
    LaneKind,
    Profile,
)
from schedproj.core.picker import Policy
from schedproj.core.pools import Pool, PoolError

try:
    #: The installed package's version: pyproject.toml's ``version`` is its one home.
    __version__ = version("schedproj")
except PackageNotFoundError:  # a bare checkout on PYTHONPATH, never installed
    __version__ = "0+unknown"

if TYPE_CHECKING:
    from schedproj.on_celery.task import LaneTask, current_run
    from schedproj.ops.apps import configure_app, create_app
    from schedproj.ops.runtime_entries import add_entry, list_entries, remove_entry
    from schedproj.settings import Settings

#: Public names that live outside the pure core: where each one is loaded from on first use.
_LAZY = {
    "configure_app": "schedproj.ops.apps",
    "create_app": "schedproj.ops.apps",
    "LaneTask": "schedproj.on_celery.task",
    "current_run": "schedproj.on_celery.task",
    "Settings": "schedproj.settings",
    "add_entry": "schedproj.ops.runtime_entries",
    "remove_entry": "schedproj.ops.runtime_entries",
    "list_entries": "schedproj.ops.runtime_entries",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'schedproj' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "BeatLockLost",
    "ConfigurationError",
    "DeferralReason",
    "DeploymentClass",
    "DueAnswer",
    "DueCheckStamp",
    "Gate",
    "GateCondition",
    "Lane",
    "LaneDeclarationError",
    "LaneKind",
    "LaneTask",
    "LeaseLost",
    "Policy",
    "Pool",
    "PoolError",
    "Profile",
    "SchedprojError",
    "Settings",
    "StateError",
    "__version__",
    "add_entry",
    "configure_app",
    "create_app",
    "current_run",
    "list_entries",
    "remove_entry",
]
