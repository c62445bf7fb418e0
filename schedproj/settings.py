"""One settings object, built from the environment once and passed in.

Environment variables are ``SCHEDPROJ_<FIELD>`` (for example ``SCHEDPROJ_HOLD_CAP_S=600``), except
the broker, which keeps Celery's usual ``CELERY_BROKER_URL``.
"""

from __future__ import annotations

import difflib
import logging
import os
import ssl
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AliasChoices,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from schedproj.core import defaults
from schedproj.core.dueindex import DERIVED_RECONCILE_S, RECONCILE_SLICE
from schedproj.core.errors import ConfigurationError
from schedproj.core.lanes import Profile
from schedproj.core.picker import Policy
from schedproj.core.pools import Pool, PoolError, parse_pools
from schedproj.core.pressure import DEFAULT_MIN_HOLD_S, DEFAULT_TARGET_RATIO, PressureRule
from schedproj.store.connection import (
    CLUSTER_SCHEMES,
    REDIS_SCHEMES,
    cluster_key_prefix,
    hash_tag,
    is_cluster_url,
    mask,
    redis_url_problem,
)

logger = logging.getLogger(__name__)


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
    key_prefix: str = Field(default=defaults.KEY_PREFIX, min_length=1,
                            description="Prefix of every Redis key schedproj writes. With a "
                            "redis+cluster:// state Redis it carries a hash tag, so all keys "
                            "share one slot: 'schedproj' is used as '{schedproj}'.")
    profile: Profile = Field(
        default=Profile.LOCAL,
        description="Deployment profile (ADR-0014): 'cloud' disables lanes declared local-only.",
    )
    policy: Policy = Field(
        default=Policy.STALENESS,
        description="Heavy-lane picking policy; 'registry' is the legacy one, for comparison.",
    )
    lane_modules: str = Field(
        default="",
        description="Comma-separated modules that declare lanes, imported by schedproj.app.",
    )
    pools: str = Field(
        default="",
        description="Pools beyond the default one-slot pool 'heavy', as name=slots separated "
        "by commas ('gpu=2,db=3'). Each pool's lanes run on the queue of its name (serve it "
        "with 'celery worker -Q gpu -c 2'); at most its slot count of them at once. Wins over "
        "a pool of the same name declared in code (configure_app(app, pools=[...])).",
    )
    cadence_scale: float = Field(
        default=1.0, gt=0,
        description="Multiplies every lane duration (cadence, retry, gate bound); for demos.",
    )
    sentry_dsn: str | None = Field(
        default=None, validation_alias=AliasChoices("SENTRY_DSN", "SCHEDPROJ_SENTRY_DSN"),
        description="Turns sentry-sdk on in beat and every worker.",
    )
    sentry_environment: str | None = Field(
        default=None,
        validation_alias=AliasChoices("SENTRY_ENVIRONMENT", "SCHEDPROJ_SENTRY_ENVIRONMENT"),
        description="Sentry's environment tag for every event.",
    )
    sentry_release: str | None = Field(
        default=None, validation_alias=AliasChoices("SENTRY_RELEASE", "SCHEDPROJ_SENTRY_RELEASE"),
        description="Sentry's release tag for every event.",
    )
    sentry_beat_monitoring: bool = Field(
        default=True, description="A Sentry Crons check-in per lane dispatch and run."
    )
    sentry_send_default_pii: bool = Field(
        default=False, description="Let Sentry send personal data (off: none is sent; events "
        "are scrubbed of URL credentials, lease tokens and secret-named keys either way).")
    metrics_port: int | None = Field(
        default=None, ge=0, le=65535, description="Beat serves Prometheus metrics here."
    )
    metrics_host: str = Field(default="127.0.0.1", description="Bind address for metrics.")
    metrics_per_member: bool = Field(
        default=False, description="Export the per-lane series for every lane family member "
        "too (a 10,000-member family makes 10,000 series of each); off, families are exported "
        "as per-family aggregates only.")
    status_user: str | None = Field(
        default=None,
        description="Basic-auth user for the status page and its JSON (served with the "
        "metrics); required, with SCHEDPROJ_STATUS_PASSWORD, when SCHEDPROJ_METRICS_HOST is "
        "not a loopback address.",
    )
    status_password: SecretStr | None = Field(
        default=None, description="Basic-auth password for the status page and its JSON.",
    )
    starvation_threshold_s: float = Field(
        default=3600.0, gt=0,
        description="A due heavy lane waiting longer than this degrades the watchdog posture.",
    )
    lease_ttl_s: float = Field(
        default=defaults.LEASE_TTL_S, gt=0,
        description="TTL of the renewable heavy lease: how fast a dead holder's lease frees "
        "itself (renewed every third of it).")
    start_deadline_s: float = Field(
        default=defaults.START_DEADLINE_S, gt=0,
        description="A heavy message not started this long after its grant is refused (its "
        "lease lapsed on Redis's clock) and dropped by RabbitMQ.")
    state_loss_quarantine_s: float | None = Field(
        default=None, gt=0,
        description="After Redis lost state (restart, failover), no heavy lease is granted for "
        "this long while earlier holders re-assert theirs; default: the lease TTL plus one "
        "renewal interval (4/3 of the TTL).",
    )
    hold_cap_s: float = Field(
        default=defaults.HOLD_CAP_S, gt=0,
        description="A heavy run is told to yield after holding the lease this long.")
    pressure_yield: bool = Field(
        default=defaults.PRESSURE_YIELD,
        description="A heavy run also yields before the hold cap when a waiting heavy lane "
        "presses (SCHEDPROJ_PRESSURE_TARGET_RATIO, SCHEDPROJ_PRESSURE_MIN_HOLD_S).",
    )
    pressure_target_ratio: float = Field(
        default=DEFAULT_TARGET_RATIO, gt=0,
        description="Staleness ratio (dimensionless) a waiting heavy lane must reach to make "
        "the holder yield; a priority-0 lane presses at once.",
    )
    pressure_min_hold_s: float = Field(
        default=DEFAULT_MIN_HOLD_S, ge=0,
        description="Seconds a heavy run holds the lease before pressure can make it yield.",
    )
    max_hold_s: float = Field(
        default=defaults.MAX_HOLD_S, gt=0,
        description="The lease is never renewed past this (a backstop); heavy time limits "
        "must stay below it.")
    beat_lock_ttl_s: float = Field(
        default=defaults.BEAT_LOCK_TTL_S, gt=0,
        description="TTL of the single-active-beat lock (at least 3x the loop interval): how "
        "soon a standby beat takes over from a dead one.")
    beat_max_loop_interval_s: float = Field(
        default=defaults.BEAT_MAX_LOOP_INTERVAL_S, gt=0,
        description="Longest beat sleep between ticks (a finishing run wakes it sooner).")
    derived_reconcile_s: float = Field(
        default=DERIVED_RECONCILE_S, gt=0,
        description="How often the active beat begins re-checking every lane's place in the "
        "due index (seconds): a cycle of slices, one a tick; a lane is re-checked at least "
        "every max(this, ticks the cycle takes x the tick interval).")
    reconcile_slice: int = Field(
        default=RECONCILE_SLICE, ge=1,
        description="Lanes one tick of that cycle re-checks (each read once more by the next "
        "tick): the cycle takes ceil(lanes / this) ticks.")
    compact_records: bool = Field(
        default=False,
        description="Write each lane's run and sched records in the compact format (version 2: "
        "short keys, about 96 bytes of Redis less a lane). Set it on beat and every worker "
        "only once all of them run a release that reads it (this one or later): an earlier "
        "release refuses a compact record (a version error naming its key). Off, records are "
        "written in the long format; either way both formats are read. Before rolling back "
        "below this release, turn it off and run 'schedproj records --to long'.")
    wake_on_release: bool = Field(
        default=True,
        description="Beat blocks on the wake list so a finishing run is followed at once; "
        "off, it only polls (kept for the hand-off benchmark).",
    )
    heavy_time_limit_s: float = Field(
        default=defaults.HEAVY_TIME_LIMIT_S, gt=0,
        description="Hard time limit of heavy lane tasks that set none (soft: 90 %); must be "
        "below the max hold and the broker's redelivery bound (the visibility timeout on "
        "Redis, consumer_timeout on RabbitMQ).")
    light_time_limit_s: float = Field(
        default=defaults.LIGHT_TIME_LIMIT_S, gt=0,
        description="Hard time limit of light lane tasks that set none (soft: 90 %).")
    visibility_timeout_s: float = Field(
        default=defaults.VISIBILITY_TIMEOUT_S, gt=0,
        description="Redis broker visibility timeout: an app's shorter one is raised to this, "
        "so a heavy run is never redelivered while it still runs.")
    rabbitmq_consumer_timeout_s: float = Field(
        default=defaults.RABBITMQ_CONSUMER_TIMEOUT_S, ge=0,
        description="RabbitMQ's consumer_timeout as the broker has it (rabbitmq.conf, in ms "
        "there; seconds here; 0 = disabled on the server). With an amqp:// broker, every hard "
        "time limit must stay below it, or RabbitMQ closes the worker's channel mid-run and "
        "redelivers the message.",
    )
    redis_ssl_ca_certs: str | None = Field(
        default=None,
        description="CA bundle (PEM) that signed the Redis server's certificate, for every "
        "rediss:// URL (broker, state, audit); default: the system's CAs. A URL's own "
        "?ssl_ca_certs= wins.",
    )
    redis_ssl_certfile: str | None = Field(
        default=None, description="Client certificate (PEM) for Redis servers that verify "
        "clients (tls-auth-clients yes).")
    redis_ssl_keyfile: str | None = Field(
        default=None, description="Private key of SCHEDPROJ_REDIS_SSL_CERTFILE.")
    redis_ssl_cert_reqs: Literal["required", "optional", "none"] = Field(
        default="required",
        description="Verify the Redis server's certificate: required (default), optional, "
        "or none (no verification: only for testing).",
    )

    @field_validator("pools")
    @classmethod
    def _pools(cls, text: str) -> str:
        try:
            parse_pools(text)
        except PoolError as exc:
            raise ValueError(str(exc)) from None
        return text

    @field_validator("redis_url", "audit_redis_url")
    @classmethod
    def _redis_url(cls, url: str | None) -> str | None:
        problem = None if url is None else redis_url_problem(url)
        if problem is not None:
            raise ValueError(problem)
        return url

    @field_validator("broker_url")
    @classmethod
    def _broker_url(cls, url: str) -> str:
        if urlsplit(url).scheme in CLUSTER_SCHEMES:
            raise ValueError(
                "Celery's Redis transport cannot use a Redis Cluster as its broker. Fix: point "
                "CELERY_BROKER_URL at a plain Redis (redis://) or RabbitMQ, and "
                "SCHEDPROJ_REDIS_URL at the cluster for schedproj's state")
        # Only a Redis broker is a Redis URL; other transports are Celery's to judge.
        if urlsplit(url).scheme in REDIS_SCHEMES:
            problem = redis_url_problem(url)
            if problem is not None:
                raise ValueError(problem)
        return url

    @field_validator("key_prefix")
    @classmethod
    def _key_prefix(cls, prefix: str, info: ValidationInfo) -> str:
        # On a Redis Cluster every key of the deployment must share one slot (the scripts
        # touch several at once): a hash tag does that. Fields are validated in order, so the
        # URLs above are known here.
        if not is_cluster_url(info.data.get("redis_url")) or hash_tag(prefix):
            return prefix
        if "{" in prefix or "}" in prefix:
            raise ValueError(
                "with a Redis Cluster (SCHEDPROJ_REDIS_URL=redis+cluster://...) every key must "
                "hash to one slot, and this prefix has braces but no hash tag Redis would use "
                "(a non-empty {...}). Fix: write it as {name}, or without braces (schedproj "
                "then uses {name})")
        return cluster_key_prefix(prefix)

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        if self.redis_url is None and not self.broker_url.startswith(("redis://", "rediss://")):
            raise ValueError(
                "SCHEDPROJ_REDIS_URL: the broker is not Redis, so set SCHEDPROJ_REDIS_URL to "
                "the Redis that holds lane state and the lease"
            )
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
                self.broker_is_amqp or self.heavy_time_limit_s < self.visibility_timeout_s,
                "SCHEDPROJ_HEAVY_TIME_LIMIT_S",
                f"heavy hard time limit {self.heavy_time_limit_s}s must be below the broker "
                f"visibility timeout {self.visibility_timeout_s}s, or a long heavy run is "
                f"redelivered while it still runs; lower it or raise "
                f"SCHEDPROJ_VISIBILITY_TIMEOUT_S",
            ),
            *[(self.consumer_timeout_allows(limit), f"SCHEDPROJ_{kind.upper()}_TIME_LIMIT_S",
               consumer_timeout_problem(f"{kind} hard time limit {limit:g}s",
                                        self.rabbitmq_consumer_timeout_s,
                                        f"lower SCHEDPROJ_{kind.upper()}_TIME_LIMIT_S"))
              for kind, limit in (("heavy", self.heavy_time_limit_s),
                                  ("light", self.light_time_limit_s))],
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
        return self

    @property
    def broker_is_amqp(self) -> bool:
        """True when the broker is RabbitMQ (an AMQP URL), not Redis."""
        return self.broker_url.split("://", 1)[0].lower() in AMQP_SCHEMES

    def consumer_timeout_allows(self, limit_s: float) -> bool:
        """Whether a run of at most ``limit_s`` is acknowledged before RabbitMQ's
        consumer_timeout (always, on a Redis broker or when the timeout is disabled)."""
        timeout = self.rabbitmq_consumer_timeout_s
        return not self.broker_is_amqp or timeout == 0 or limit_s < timeout

    @property
    def redis_tls(self) -> dict[str, str]:
        """TLS options for every ``rediss://`` client, as redis-py's URL query names them."""
        options: dict[str, str] = {"ssl_cert_reqs": self.redis_ssl_cert_reqs}
        for name, value in (("ssl_ca_certs", self.redis_ssl_ca_certs),
                            ("ssl_certfile", self.redis_ssl_certfile),
                            ("ssl_keyfile", self.redis_ssl_keyfile)):
            if value:
                options[name] = value
        return options

    def broker_ssl(self) -> dict[str, Any] | None:
        """Celery's ``broker_use_ssl`` for a ``rediss://`` broker: the settings' TLS options
        (a URL's own ``ssl_*`` query parameters take precedence in kombu); None otherwise.
        Without it kombu would not verify the server's certificate at all."""
        if not self.broker_url.lower().startswith("rediss"):
            return None
        options: dict[str, Any] = dict(self.redis_tls)
        options["ssl_cert_reqs"] = CERT_REQS[self.redis_ssl_cert_reqs]
        return options

    @property
    def quarantine_s(self) -> float:
        """How long nothing new is granted after a state loss: every holder renews every third
        of the TTL, so within a TTL and one renewal interval each has re-asserted its lease or
        (unable to reach Redis for two thirds of a TTL) flagged itself lost."""
        if self.state_loss_quarantine_s is not None:
            return self.state_loss_quarantine_s
        return self.lease_ttl_s * defaults.QUARANTINE_TTL_RATIO

    @property
    def pressure_rule(self) -> PressureRule | None:
        """The pressure-aware yielding rule, or None when it is off."""
        if not self.pressure_yield:
            return None
        return PressureRule(target_ratio=self.pressure_target_ratio,
                            min_hold_s=self.pressure_min_hold_s)

    @property
    def state_redis_url(self) -> str:
        """The Redis URL for state and lease (the broker's when none is set)."""
        return self.redis_url or self.broker_url

    @property
    def declared_pools(self) -> tuple[Pool, ...]:
        """The pools ``SCHEDPROJ_POOLS`` declares (none: only the default pool)."""
        return parse_pools(self.pools)

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
            raise ConfigurationError(
                "invalid schedproj settings:\n  " + "\n  ".join(explain(exc, "SCHEDPROJ_"))
            ) from None


#: Broker URL schemes that mean RabbitMQ (kombu's AMQP transports).
AMQP_SCHEMES = frozenset({"amqp", "amqps", "pyamqp", "librabbitmq"})
#: ``ssl_cert_reqs`` names to the ``ssl`` module's constants (what kombu's ``ssl`` dict takes).
CERT_REQS = {"required": ssl.CERT_REQUIRED, "optional": ssl.CERT_OPTIONAL,
             "none": ssl.CERT_NONE}


def consumer_timeout_problem(what: str, timeout_s: float, lower: str) -> str:
    """Why a time limit clashes with RabbitMQ's consumer_timeout, and the two fixes."""
    return (f"{what} is not below RabbitMQ's consumer_timeout {timeout_s:g}s "
            f"(SCHEDPROJ_RABBITMQ_CONSUMER_TIMEOUT_S; RabbitMQ's default is 1800s), so RabbitMQ "
            f"would close the worker's channel and redeliver the message while the run goes "
            f"on; {lower}, or raise consumer_timeout on the server (rabbitmq.conf: "
            f"consumer_timeout = <ms>) and set SCHEDPROJ_RABBITMQ_CONSUMER_TIMEOUT_S to match")


def explain(exc: ValidationError, env_prefix: str) -> list[str]:
    """One line per problem, naming the environment variable, what is wrong and what it got
    (URLs masked: never echo a password)."""
    problems = []
    for err in exc.errors():
        message = str(err["msg"]).removeprefix("Value error, ")
        if not err["loc"]:
            # A cross-field check: its message names the variable; the input is the whole
            # settings dict, which may hold credentials, so it is not echoed.
            problems.append(message)
            continue
        where = ".".join(str(p) for p in err["loc"])
        got = err.get("input")
        if isinstance(got, str) and "url" in where:
            got = mask(got)
        env = "CELERY_BROKER_URL" if where == "broker_url" else f"{env_prefix}{where.upper()}"
        problems.append(f"{env}: {message} (got {got!r})")
    return problems


#: Variables with the prefix that are not settings: read by the start scripts, not by Python.
NON_SETTING_ENV = frozenset({"SCHEDPROJ_APP"})
#: Prefixes of settings that belong to a wing's own settings object, which checks them itself
#: (the REM lanes: :class:`schedproj.rem.settings.RemSettings`).
WING_ENV_PREFIXES = ("SCHEDPROJ_REM_",)


def _warn_unknown_env() -> None:
    """A misspelled variable would silently keep its default: say so, with a suggestion."""
    known = {f"SCHEDPROJ_{name.upper()}" for name in Settings.model_fields} | NON_SETTING_ENV
    for name in sorted(os.environ):
        if (not name.startswith("SCHEDPROJ_") or name in known
                or name.startswith(WING_ENV_PREFIXES)):
            continue
        close = difflib.get_close_matches(name, sorted(known), n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        logger.warning("ignoring unknown setting %s%s", name, hint)
