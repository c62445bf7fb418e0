"""Settings of the REM reference lanes, apart from the scheduler's own: the same environment
variables as always (``SCHEDPROJ_REM_<FIELD>``), read once per process on first use."""

from __future__ import annotations

import difflib
import logging
import os
from functools import cache

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from schedproj.core.errors import ConfigurationError
from schedproj.settings import explain

logger = logging.getLogger(__name__)

ENV_PREFIX = "SCHEDPROJ_REM_"


class RemSettings(BaseSettings):
    """What the REM lanes can be configured with. Units are in the names."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    window_words: int = Field(
        default=1000, gt=0,
        description="Model context window (words): longer sessions need per-turn backfill.",
    )
    batch: int = Field(default=50, gt=0, description="Items per REM lane batch.")
    summarizer: str | None = Field(
        default=None,
        description="'module:factory' of your summarizer; default: local extractive.",
    )
    summarizer_latency_s: float = Field(
        default=0.0, ge=0, description="Simulated model latency per summarizer call (demo)."
    )
    backup_dir: str = Field(default="backups", min_length=1,
                            description="Where the backup lane writes its snapshots.")
    backup_keep: int = Field(default=7, gt=0, description="Backup snapshots kept (newest).")

    @classmethod
    def load(cls, **overrides: object) -> RemSettings:
        """Build from the environment; a bad value is one clear error naming the variable."""
        _warn_unknown_env()
        try:
            return cls(**overrides)  # type: ignore[arg-type]
        except ValidationError as exc:
            raise ConfigurationError(
                "invalid REM settings:\n  " + "\n  ".join(explain(exc, ENV_PREFIX))
            ) from None


def _warn_unknown_env() -> None:
    """A misspelled REM variable would silently keep its default: say so."""
    known = sorted(f"{ENV_PREFIX}{name.upper()}" for name in RemSettings.model_fields)
    for name in sorted(os.environ):
        if name.startswith(ENV_PREFIX) and name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            logger.warning("ignoring unknown REM setting %s%s", name, hint)


@cache
def rem_settings() -> RemSettings:
    """This process's REM settings (read once)."""
    return RemSettings.load()


__all__ = ["RemSettings", "rem_settings"]
