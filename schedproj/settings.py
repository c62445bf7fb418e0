"""One settings object, built from the environment once and passed in.

Environment variables are ``SCHEDPROJ_<FIELD>`` (for example ``SCHEDPROJ_HOLD_CAP_S=600``), except
the broker, which keeps Celery's usual ``CELERY_BROKER_URL``.
"""

from __future__ import annotations

import difflib
import logging
import os
from enum import StrEnum
from typing import Any

from pydantic import AliasChoices, Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from schedproj import defaults
from schedproj.errors import ConfigurationError
from schedproj.picker import Policy
from schedproj.redis_conn import mask

logger = logging.getLogger(__name__)


class Profile(StrEnum):
    """Deployment profile (ADR-0014): which lane deployment classes may run here."""

    #: A developer or on-premises host: every lane may run.
    LOCAL = "local"
    #: A cloud deployment: lanes declared local-only are disabled.
    CLOUD = "cloud"


class Settings(BaseSettings):
    """Everything schedproj can be configured with. Units are in the names."""

    model_config = SettingsConfigDict(
        env_prefix="SCHEDPROJ_", extra="ignore", frozen=True, populate_by_name=True
    )

    broker_url: str = Field(
        default="redis://127.0.0.1:6379/0",
        validation_alias=AliasChoices("CELERY_BROKER_URL", "SCHEDPROJ_BROKER_URL"),
        description="Celery broker URL.",
    )
    redis_url: str | None = Field(
        default=None, description="Redis for lane state and the lease; defaults to the broker."
    )
    audit_redis_url: str | None = Field(
        default=None,
        description="Redis for the run journal and dispatch log (default: the state Redis). "
        "A separate one keeps the audit trail when the state Redis loses everything.",
    )
    key_prefix: str = Field(default=defaults.KEY_PREFIX, min_length=1)
    profile: Profile = Profile.LOCAL
    policy: Policy = Field(
        default=Policy.STALENESS,
        description="Heavy-lane picking policy; 'registry' is the legacy one, for comparison.",
    )
    lane_modules: str = Field(
        default="",
        description="Comma-separated modules that declare lanes, imported by schedproj.app.",
    )
    cadence_scale: float = Field(
        default=1.0, gt=0,
        description="Multiplies every lane duration (cadence, retry, gate bound); for demos.",
    )
    rem_window_words: int = Field(
        default=1000, gt=0,
        description="Model context window (words): longer sessions need per-turn backfill.",
    )
    rem_batch: int = Field(default=50, gt=0, description="Items per REM lane batch.")
    rem_summarizer: str | None = Field(
        default=None,
        description="'module:factory' of your summarizer; default: local extractive.",
    )
    rem_summarizer_latency_s: float = Field(
        default=0.0, ge=0, description="Simulated model latency per summarizer call (demo)."
    )
    rem_backup_dir: str = Field(default="backups", min_length=1)
    rem_backup_keep: int = Field(default=7, gt=0)
    sentry_dsn: str | None = Field(
        default=None, validation_alias=AliasChoices("SENTRY_DSN", "SCHEDPROJ_SENTRY_DSN"),
        description="Turns sentry-sdk on in beat and every worker.",
    )
    sentry_environment: str | None = Field(
        default=None,
        validation_alias=AliasChoices("SENTRY_ENVIRONMENT", "SCHEDPROJ_SENTRY_ENVIRONMENT"),
    )
    sentry_release: str | None = Field(
        default=None, validation_alias=AliasChoices("SENTRY_RELEASE", "SCHEDPROJ_SENTRY_RELEASE"),
    )
    sentry_beat_monitoring: bool = Field(
        default=True, description="A Sentry Crons check-in per lane dispatch and run."
    )
    sentry_send_default_pii: bool = False
    metrics_port: int | None = Field(
        default=None, ge=0, le=65535, description="Beat serves Prometheus metrics here."
    )
    metrics_host: str = Field(default="127.0.0.1", description="Bind address for metrics.")
    starvation_threshold_s: float = Field(
        default=3600.0, gt=0,
        description="A due heavy lane waiting longer than this degrades the watchdog posture.",
    )
    lease_ttl_s: float = Field(default=defaults.LEASE_TTL_S, gt=0)
    start_deadline_s: float = Field(default=defaults.START_DEADLINE_S, gt=0)
    hold_cap_s: float = Field(default=defaults.HOLD_CAP_S, gt=0)
    max_hold_s: float = Field(default=defaults.MAX_HOLD_S, gt=0)
    beat_lock_ttl_s: float = Field(default=defaults.BEAT_LOCK_TTL_S, gt=0)
    beat_max_loop_interval_s: float = Field(default=defaults.BEAT_MAX_LOOP_INTERVAL_S, gt=0)
    wake_on_release: bool = Field(
        default=True,
        description="Beat blocks on the wake list so a finishing run is followed at once; "
        "off, it only polls (kept for the hand-off benchmark).",
    )
    heavy_time_limit_s: float = Field(default=defaults.HEAVY_TIME_LIMIT_S, gt=0)
    light_time_limit_s: float = Field(default=defaults.LIGHT_TIME_LIMIT_S, gt=0)
    visibility_timeout_s: float = Field(default=defaults.VISIBILITY_TIMEOUT_S, gt=0)

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        checks = [
            (
                self.beat_lock_ttl_s
                >= defaults.BEAT_LOCK_MIN_LOOP_RATIO * self.beat_max_loop_interval_s,
                "SCHEDPROJ_BEAT_LOCK_TTL_S",
                f"beat lock TTL {self.beat_lock_ttl_s}s is not comfortably above the beat loop "
                f"interval {self.beat_max_loop_interval_s}s; make it at least "
                f"{defaults.BEAT_LOCK_MIN_LOOP_RATIO:g}x the interval "
                f"(or lower SCHEDPROJ_BEAT_MAX_LOOP_INTERVAL_S)",
            ),
            (
                self.heavy_time_limit_s < self.visibility_timeout_s,
                "SCHEDPROJ_HEAVY_TIME_LIMIT_S",
                f"heavy hard time limit {self.heavy_time_limit_s}s must be below the broker "
                f"visibility timeout {self.visibility_timeout_s}s, or a long heavy run is "
                f"redelivered while it still runs; lower it or raise "
                f"SCHEDPROJ_VISIBILITY_TIMEOUT_S",
            ),
            (
                self.heavy_time_limit_s < self.max_hold_s,
                "SCHEDPROJ_HEAVY_TIME_LIMIT_S",
                f"heavy hard time limit {self.heavy_time_limit_s}s is not below the maximum "
                f"lease hold {self.max_hold_s}s, so a run that never yields would outlive its "
                "lease while another heavy lane starts; lower it or raise SCHEDPROJ_MAX_HOLD_S",
            ),
            (
                self.hold_cap_s <= self.max_hold_s,
                "SCHEDPROJ_HOLD_CAP_S",
                f"hold cap {self.hold_cap_s}s exceeds the maximum hold {self.max_hold_s}s; "
                f"lower it or raise SCHEDPROJ_MAX_HOLD_S",
            ),
            (
                self.lease_ttl_s >= 3 * 0.2,
                "SCHEDPROJ_LEASE_TTL_S",
                "lease TTL must be at least 0.6s so it can be renewed in time",
            ),
        ]
        for ok, name, message in checks:
            if not ok:
                raise ValueError(f"{name}: {message}")
        if self.redis_url is None and not self.broker_url.startswith(("redis://", "rediss://")):
            raise ValueError(
                "SCHEDPROJ_REDIS_URL: the broker is not Redis, so set SCHEDPROJ_REDIS_URL to "
                "the Redis that holds lane state and the lease"
            )
        return self

    @property
    def state_redis_url(self) -> str:
        """The Redis URL for state and lease (the broker's when none is set)."""
        return self.redis_url or self.broker_url

    @property
    def lane_module_list(self) -> list[str]:
        return [m.strip() for m in self.lane_modules.split(",") if m.strip()]

    @classmethod
    def load(cls, **overrides: Any) -> Settings:
        """Build settings from the environment, turning validation errors into clear ones."""
        aliases = {"CELERY_BROKER_URL", "SCHEDPROJ_BROKER_URL", "SENTRY_DSN",
                   "SENTRY_ENVIRONMENT", "SENTRY_RELEASE"}
        unknown = sorted(set(overrides) - set(cls.model_fields) - aliases)
        if unknown:
            raise ConfigurationError(
                f"unknown schedproj settings {unknown}; known: {sorted(cls.model_fields)}"
            )
        _warn_unknown_env()
        try:
            return cls(**overrides)
        except ValidationError as exc:
            problems = []
            for err in exc.errors():
                message = str(err["msg"]).removeprefix("Value error, ")
                if not err["loc"]:
                    # A cross-field check: its message names the variable; the input is the
                    # whole settings dict, which may hold credentials, so it is not echoed.
                    problems.append(message)
                    continue
                where = ".".join(str(p) for p in err["loc"])
                got = err.get("input")
                if isinstance(got, str) and "url" in where:
                    got = mask(got)  # never echo a password
                env = "CELERY_BROKER_URL" if where == "broker_url" else f"SCHEDPROJ_{where.upper()}"
                problems.append(f"{env}: {message} (got {got!r})")
            raise ConfigurationError(
                "invalid schedproj settings:\n  " + "\n  ".join(problems)
            ) from None


#: Variables with the prefix that are not settings: read by the start scripts, not by Python.
NON_SETTING_ENV = frozenset({"SCHEDPROJ_APP"})


def _warn_unknown_env() -> None:
    """A misspelled variable would silently keep its default: say so, with a suggestion."""
    known = {f"SCHEDPROJ_{name.upper()}" for name in Settings.model_fields} | NON_SETTING_ENV
    for name in sorted(os.environ):
        if not name.startswith("SCHEDPROJ_") or name in known:
            continue
        close = difflib.get_close_matches(name, sorted(known), n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        logger.warning("ignoring unknown setting %s%s", name, hint)
