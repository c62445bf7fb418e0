"""``schedproj records --to long|compact`` (the step before rolling back below the release that
introduced the compact record format) against a real Redis: it rewrites, says what it did,
exits non-zero while anything is left, and refuses --to long where the setting is still on."""

from __future__ import annotations

import pytest
import redis
from click.testing import CliRunner

from schedproj.core.records import (
    COMPACT_FORMAT,
    LONG_FORMAT,
    RunRecord,
    decode_with_format,
    encode,
)
from schedproj.ops import cli
from schedproj.store.protocol import Keys, run_field
from tests.conftest import REDIS_URL

pytestmark = pytest.mark.timeout(60)

RECORD = RunRecord(last_run_at=1796405433.989978, runs=3, last_task_id="T3")


@pytest.fixture
def env(key_prefix: str) -> dict[str, str]:
    return {"SCHEDPROJ_REDIS_URL": REDIS_URL, "CELERY_BROKER_URL": REDIS_URL,
            "SCHEDPROJ_KEY_PREFIX": key_prefix}


def test_records_to_long_rewrites_the_compact_ones(client: redis.Redis, keys: Keys,
                                                   env: dict[str, str]) -> None:
    client.hset(keys.lanes, mapping={run_field("a"): encode(RECORD, compact=True),
                                     run_field("b"): encode(RECORD)})
    dry = CliRunner().invoke(cli.main, ["records", "--to", "long", "--dry-run"], env=env)
    assert dry.exit_code == 0, dry.output
    assert "1 records would be rewritten in the long format, 1 already in it" in dry.output
    done = CliRunner().invoke(cli.main, ["records", "--to", "long"], env=env)
    assert done.exit_code == 0, done.output
    assert "1 records rewritten in the long format" in done.output
    for lane in ("a", "b"):
        assert decode_with_format(RunRecord, client.hget(keys.lanes, run_field(lane)),
                                  "k") == (LONG_FORMAT, RECORD)
    again = CliRunner().invoke(cli.main, ["records", "--to", "compact"], env=env)
    assert again.exit_code == 0 and "2 records rewritten" in again.output
    assert decode_with_format(RunRecord, client.hget(keys.lanes, run_field("a")),
                              "k") == (COMPACT_FORMAT, RECORD)


def test_records_to_long_refuses_while_the_setting_is_on(client: redis.Redis, keys: Keys,
                                                         env: dict[str, str]) -> None:
    client.hset(keys.lanes, run_field("a"), encode(RECORD, compact=True))
    result = CliRunner().invoke(cli.main, ["records", "--to", "long"],
                                env={**env, "SCHEDPROJ_COMPACT_RECORDS": "1"})
    assert result.exit_code == 1 and "turn it off" in result.output
    assert client.hget(keys.lanes, run_field("a")) == encode(RECORD, compact=True)


def test_an_unreadable_record_is_named_and_fails_the_command(client: redis.Redis, keys: Keys,
                                                             env: dict[str, str]) -> None:
    client.hset(keys.lanes, run_field("bad"), '{"v":2,"zz":1}')
    result = CliRunner().invoke(cli.main, ["records", "--to", "long"], env=env)
    assert result.exit_code == 1
    assert "1 unreadable" in result.output and "'bad|run'" in result.output
