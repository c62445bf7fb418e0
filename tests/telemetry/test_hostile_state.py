"""Hostile state never stops the tools: ``schedproj status`` (plain and ``--json``), every path
of the status page and ``/metrics`` answer whatever any key holds — a wrong Redis type, a huge
integer, NaN, control characters, Rich markup, missing fields — and name the key and the fix.

A healthy deployment is written first (a lane set with a heavy lane, a light lane and a family,
their records, a lease, beat's info, the watchdog latch, counters, the journal); then one key is
spoiled and every tool is asked.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from prometheus_client import CollectorRegistry

from schedproj import Lane, LaneKind
from schedproj.core.families import LaneFamily
from schedproj.core.laneset import build_lane_set, registry_json
from schedproj.core.records import RunRecord, SchedRecord, encode
from schedproj.ops.cli import main as cli
from schedproj.settings import Settings
from schedproj.store.protocol import Keys
from schedproj.telemetry.metrics import SchedprojCollector
from schedproj.telemetry.webserver import StatusServer, start

pytestmark = pytest.mark.timeout(120)

FAMILY = "tenant-sync"
MEMBERS = ("acme/web", "plain", "/x")
PAGE_PATHS = ("/", "/status", "/api/status", "/api/timeline", "/metrics")
#: Escapes that must never reach an operator's terminal (OSC title, colour, bell).
ESCAPES = "\x1b]0;TITLE\x07\x1b[31m"
HUGE = "1" + "0" * 400


class FakeTask:
    def __init__(self, lane: object) -> None:
        self.lane = lane
        self.queue = None


def write_deployment(client: redis.Redis, keys: Keys) -> None:
    """A deployment as beat and workers leave it: every key the tools read holds a sane
    value."""
    now = time.time()
    lanes = build_lane_set({"x.heavy": FakeTask(Lane(cadence_s=60)),
                            "x.light": FakeTask(Lane(cadence_s=30, kind=LaneKind.LIGHT)),
                            FAMILY: FakeTask(LaneFamily(cadence_s=60))})
    client.set(keys.published_lanes, registry_json(lanes, Settings()))
    records = {"x.heavy|run": encode(RunRecord(last_run_at=now - 90, runs=3, backlog=2)),
               "x.heavy|sched": encode(SchedRecord(last_dispatch_at=now - 95, dispatches=3)),
               "x.light|run": encode(RunRecord(last_run_at=now - 10, runs=9))}
    for key in MEMBERS:
        records[f"{FAMILY}[{key}]|run"] = encode(RunRecord(since=now - 5))
    client.hset(keys.lanes, mapping=records)
    client.sadd(keys.families, FAMILY)
    client.sadd(keys.family(FAMILY), *MEMBERS)
    client.set(keys.lease, json.dumps({"v": 1, "lane": "x.heavy", "token": "t0k3n",
                                       "fence": 7, "granted_at": now - 3, "started_at": now - 2,
                                       "task_id": "task-1", "epoch": 1}))
    client.set(keys.lease_fence, 7)
    client.set(keys.beat_fence, 3)
    client.hset(keys.beat_info, mapping={"host": "h1", "pid": "42", "since": str(now - 60),
                                         "token": "beat-secret"})
    client.set(keys.beat_lock, "beat-secret")
    client.set(keys.watchdog, json.dumps({
        "v": 1, "posture": "healthy", "assessed_at": now - 5, "stalled": False,
        "stall_since": None, "alarm_fired_at": None, "cleared_at": None, "alarms": 0,
        "reasons": []}))
    client.hset(keys.counters, mapping={"lease_acquisitions": "7", "yields|x.heavy": "1"})
    client.rpush(keys.journal, *[json.dumps(e) for e in (
        {"ev": "start", "lane": "x.heavy", "task": "a", "fence": 6, "t": now - 50},
        {"ev": "end", "lane": "x.heavy", "task": "a", "fence": 6, "t": now - 40,
         "outcome": "completed"},
        {"ev": "start", "lane": "x.heavy", "task": "task-1", "fence": 7, "t": now - 2})])


# -- how each tool is asked -------------------------------------------------------------------

@dataclass
class Tools:
    client: redis.Redis
    keys: Keys
    redis_url: str
    base: str

    def status(self, *args: str) -> tuple[int, str]:
        env = {"SCHEDPROJ_REDIS_URL": self.redis_url, "SCHEDPROJ_KEY_PREFIX": self.keys.prefix}
        result = CliRunner().invoke(cli, ["status", *args], env=env)
        text = result.output
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            text += f"\nTraceback: {result.exception!r}"
        return result.exit_code, text

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.base + path, timeout=20) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()


@pytest.fixture
def tools(client: redis.Redis, key_prefix: str, redis_url: str) -> Iterator[Tools]:
    keys = Keys(key_prefix)
    write_deployment(client, keys)
    s = Settings(metrics_port=0, key_prefix=key_prefix)
    registry = CollectorRegistry()
    registry.register(SchedprojCollector(client, keys, s, ()))
    server: StatusServer = start(registry, client, keys, s, ())
    yield Tools(client, keys, redis_url, f"http://127.0.0.1:{server.server_address[1]}")
    server.shutdown()
    server.server_close()


def strict_json(text: str) -> Any:
    def refuse(name: str) -> None:
        raise ValueError(f"non-standard JSON constant {name}")
    return json.loads(text, parse_constant=refuse)


def check_every_tool(tools: Tools, named: str | None = None) -> dict[str, str]:
    """Ask status (plain and JSON), every page path and /metrics; all must answer, with no
    traceback and nothing raw for the terminal. Returns what each said."""
    said: dict[str, str] = {}
    code, text = tools.status()
    assert code == 0, text
    assert "Traceback" not in text and "\x1b" not in text and "\x07" not in text, text
    said["plain"] = text
    code, text = tools.status("--json")
    assert code == 0, text
    strict_json(text)
    said["json"] = text
    for path in PAGE_PATHS:
        code, body = tools.get(path)
        assert code == 200, f"{path}: {code} {body[:300]}"
        assert body and "Traceback" not in body, path
        if path.startswith("/api/"):
            strict_json(body)
        said[path] = body
    assert re.search(r"^schedproj_state_up 1\.0$", said["/metrics"], re.MULTILINE)
    assert 'id="lanes"' in said["/"]
    if named is not None:
        # Only the page reads the journal.
        for where in ("/",) if named.endswith(":journal") else ("plain", "json", "/"):
            flat = said[where].replace("\n", "")
            assert named in flat or json.dumps(named)[1:-1] in flat, \
                f"{where} does not name {named!r}: {said[where][-2000:]}"
    return said


def test_the_healthy_deployment_reads_cleanly(tools: Tools) -> None:
    said = check_every_tool(tools)
    assert "x.heavy" in said["plain"] and "problem" not in said["plain"]


# -- 4: data is never markup or terminal control ----------------------------------------------

def test_status_prints_member_names_and_lane_names_as_text(tools: Tools) -> None:
    code, text = tools.status("--family", FAMILY)
    assert code == 0, text
    for key in MEMBERS:  # "[acme/web]" was a style tag; "[/x]" a MarkupError
        assert f"{FAMILY}[{key}]" in text, text
    registry = json.loads(tools.client.get(tools.keys.published_lanes))
    registry["lanes"][0]["name"] = "evil[/oops]"
    tools.client.set(tools.keys.published_lanes, json.dumps(registry))
    tools.client.hset(tools.keys.lanes, "evil[/oops]|run",
                      encode(RunRecord(last_run_at=time.time(), runs=1)))
    said = check_every_tool(tools)
    assert "evil[/oops]" in said["plain"]


def test_a_failure_reason_never_reaches_the_terminal_raw(tools: Tools) -> None:
    tools.client.hset(tools.keys.lanes, "x.light|run", encode(RunRecord(
        last_run_at=time.time(), runs=1, failures=1, last_outcome="failed",
        last_reason=ESCAPES + "[bold]boom")))
    tools.client.hset(tools.keys.errors, "x[red]" + ESCAPES, "bad [/x] " + ESCAPES)
    said = check_every_tool(tools)
    cells = re.sub(r"[\s│┃]", "", said["plain"])  # a long cell folds over lines
    assert "\\x1b]0;TITLE\\x07\\x1b[31m[bold]boom" in cells
    assert "bad [/x]" in said["plain"]
    # The JSON keeps the data as it is: escaping is for the terminal only.
    lanes = {x["name"]: x for x in strict_json(said["json"])["lanes"]}
    assert lanes["x.light"]["last_reason"] == ESCAPES + "[bold]boom"


# -- 3 and 5: any value in any key ------------------------------------------------------------

def _set(value: str) -> Callable[[redis.Redis, str], Any]:
    return lambda c, k: c.set(k, value)


def _hash(**fields: str) -> Callable[[redis.Redis, str], Any]:
    return lambda c, k: c.hset(k, mapping=fields)


def _hfield(name: str, value: str) -> Callable[[redis.Redis, str], Any]:
    return lambda c, k: c.hset(k, name, value)


#: Each Redis type, to put where another belongs.
WRONG_TYPES: dict[str, Callable[[redis.Redis, str], Any]] = {
    "string": _set("garbage"),
    "hash": _hash(a="b"),
    "list": lambda c, k: c.rpush(k, "a"),
    "set": lambda c, k: c.sadd(k, "a"),
    "zset": lambda c, k: c.zadd(k, {"a": 1}),
}
#: Key (suffix of Keys' attribute) -> its Redis type.
KEY_TYPES = {"published_lanes": "string", "lanes": "hash", "lease": "string", "errors": "hash",
             "beat_info": "hash", "beat_lock": "string", "watchdog": "string",
             "counters": "hash", "paused": "set", "pressure": "hash", "journal": "list",
             "beat_fence": "string", "lease_fence": "string", "families": "set",
             "family": "set"}


def key_name(keys: Keys, attr: str) -> str:
    return keys.family(FAMILY) if attr == "family" else str(getattr(keys, attr))


@pytest.mark.parametrize(("attr", "kind"), [(a, t) for a, right in sorted(KEY_TYPES.items())
                                            for t in sorted(WRONG_TYPES) if t != right])
def test_a_key_of_the_wrong_type_is_named_not_an_outage(tools: Tools, attr: str,
                                                        kind: str) -> None:
    key = key_name(tools.keys, attr)
    tools.client.delete(key)
    WRONG_TYPES[kind](tools.client, key)
    # Keys the tools read name themselves when wrong; the rest must simply not matter.
    read = attr not in ("beat_fence", "lease_fence", "families")
    said = check_every_tool(tools, named=key if read else None)
    if read:
        assert "not a Redis outage" in said["/" if attr == "journal" else "plain"]


#: (key attribute, how it is spoiled, whether the tools must name the key)
VALUES: list[tuple[str, str, Callable[[redis.Redis, str], Any], bool]] = [
    ("counters", "superscript-digit", _hfield("lease_acquisitions", "²"), True),
    ("counters", "superscript-label", _hfield("yields|x.heavy", "²"), True),
    ("counters", "huge", _hfield("lease_acquisitions", HUGE), True),
    ("counters", "nan", _hfield("yields|x.heavy", "nan"), True),
    ("beat_info", "since-yesterday", _hfield("since", "yesterday"), True),
    ("beat_info", "since-nan", _hfield("since", "nan"), True),
    ("beat_info", "since-huge", _hfield("since", HUGE), True),
    ("beat_info", "markup-host", _hfield("host", "[/x]" + ESCAPES), False),
    ("watchdog", "list", _set("[1,2]"), True),
    ("watchdog", "reasons-not-list", _set('{"v":1,"posture":"x","stalled":true,'
                                          '"reasons":5,"assessed_at":"soon"}'), True),
    ("watchdog", "nan", _set('{"v":1,"posture":"healthy","stalled":false,"reasons":[],'
                             '"assessed_at":NaN}'), True),
    ("watchdog", "huge", _set('{"v":1,"posture":"healthy","stalled":true,"reasons":[],'
                              f'"assessed_at":{HUGE},"stall_since":{HUGE}}}'), True),
    ("watchdog", "markup", _set('{"v":1,"posture":"[/x]\\u001b[31m","stalled":true,'
                                '"reasons":["[/x]"],"assessed_at":1}'), False),
    ("journal", "end-without-t", lambda c, k: c.rpush(k, json.dumps(
        {"ev": "end", "lane": "x.heavy", "task": "task-1", "fence": 7})), False),
    ("journal", "start-without-lane", lambda c, k: c.rpush(k, json.dumps(
        {"ev": "start", "task": "z", "fence": 9, "t": time.time()})), False),
    ("journal", "huge-t", lambda c, k: c.rpush(k, json.dumps(
        {"ev": "start", "lane": "x.heavy", "task": "h", "fence": 9, "t": 1e300})), False),
    ("journal", "nan-t", lambda c, k: c.rpush(k, '{"ev":"end","lane":"x.heavy",'
                                                 '"task":"task-1","fence":7,"t":NaN}'), False),
    ("journal", "huge-fence", lambda c, k: c.rpush(k, json.dumps(
        {"ev": "start", "lane": "x.heavy", "task": "f", "fence": int(HUGE),
         "t": time.time()})), False),
    ("journal", "not-an-object", lambda c, k: c.rpush(k, "[1,2]", "nope", "null"), False),
    ("lanes", "huge-runs", _hfield("x.heavy|run", f'{{"v":1,"runs":{HUGE}}}'), True),
    ("lanes", "huge-backlog", _hfield("x.heavy|run", f'{{"v":1,"backlog":{HUGE}}}'), True),
    ("lanes", "huge-last-run", _hfield("x.heavy|run", f'{{"v":1,"last_run_at":{HUGE}}}'),
     True),
    ("lanes", "huge-deadline", _hfield("x.heavy|sched",
                                       f'{{"v":1,"inflight_deadline":{HUGE}}}'), True),
    ("lanes", "nan", _hfield("x.heavy|run", '{"v":1,"last_run_at":NaN}'), True),
    ("lanes", "markup-field", _hfield("[/x]" + ESCAPES + "|run", "{}"), False),
    ("lanes", "missing-fields", _hfield("x.heavy|sched", '{"v":1,"deferral":{}}'), True),
    ("lease", "huge-fence", _set(json.dumps({"v": 1, "lane": "x.heavy", "token": "t",
                                             "fence": int(HUGE), "granted_at": 1.0})), True),
    ("lease", "missing-fields", _set('{"v":1}'), True),
    ("lease", "markup-holder", _set(json.dumps({"v": 1, "lane": "[/x]" + ESCAPES,
                                                "token": "t", "fence": 1,
                                                "granted_at": time.time()})), False),
    ("published_lanes", "huge-cadence", lambda c, k: c.set(k, c.get(k).replace(
        '"cadence_s":60.0', f'"cadence_s":{HUGE}', 1)), True),
    ("published_lanes", "settings-not-numbers", lambda c, k: c.set(k, c.get(k).replace(
        '"hold_cap_s":', '"hold_cap_s":"x","_":', 1)), False),
    ("published_lanes", "family-garbage", lambda c, k: c.set(k, c.get(k).replace(
        '"families":[', '"families":["x",{"jitter":"abc"},', 1)), True),
    ("published_lanes", "families-not-a-list", lambda c, k: c.set(k, json.dumps(
        {**json.loads(c.get(k)), "families": "abc"})), True),
    ("pressure", "garbage", _hash(current="[", yields="²", **{"last-yield": "NaN"}), True),
    ("errors", "markup", _hfield("[/x]" + ESCAPES, "[bold]" + ESCAPES), False),
    ("beat_fence", "abc", _set("abc"), False),
    ("lease_fence", "1e300", _set("1e300"), False),
    ("family", "markup-members", lambda c, k: c.sadd(k, "[/x]", ESCAPES), False),
]


@pytest.mark.parametrize(("attr", "label", "spoil", "named"), VALUES,
                         ids=[f"{a}-{label}" for a, label, _, _ in VALUES])
def test_any_value_in_a_key_is_reported_not_a_crash(tools: Tools, attr: str, label: str,
                                                    spoil: Callable[[redis.Redis, str], Any],
                                                    named: bool) -> None:
    key = key_name(tools.keys, attr)
    if attr in ("watchdog", "lease", "beat_fence", "lease_fence"):
        tools.client.delete(key)
    spoil(tools.client, key)
    check_every_tool(tools, named=key if named else None)


# -- 15: nothing secret or revealing is published ----------------------------------------------

def test_the_beat_lock_token_is_not_published(tools: Tools) -> None:
    said = check_every_tool(tools)
    for where in ("plain", "json", "/", "/api/status", "/api/timeline"):
        assert "beat-secret" not in said[where], where
    beat = strict_json(said["json"])["beat"]
    assert beat["lock_held"] and beat["id"] == "beat-sec"  # its id in the logs, not the token


def test_the_server_header_names_schedproj_only(tools: Tools) -> None:
    with urllib.request.urlopen(tools.base + "/metrics", timeout=10) as response:
        assert response.headers["Server"] == "schedproj"


def test_an_unknown_family_error_lists_the_families_without_terminal_control(
        tools: Tools) -> None:
    registry = json.loads(tools.client.get(tools.keys.published_lanes))
    registry["families"].append({**registry["families"][0], "name": "f" + ESCAPES})
    tools.client.set(tools.keys.published_lanes, json.dumps(registry))
    code, text = tools.status("--family", "nope")
    assert code != 0 and "no lane family 'nope'" in text and FAMILY in text
    assert "\x1b" not in text and "\x07" not in text, text


# -- pools ------------------------------------------------------------------------------------

def test_spoiled_pools_are_reported_and_every_tool_answers(tools: Tools) -> None:
    """Pools in the registry that are no pools, a slot record that is garbage, a pool's
    pressure hash of the wrong type, a journaled run naming slots that are no slots."""
    client, keys = tools.client, tools.keys
    registry = json.loads(client.get(keys.published_lanes))
    registry["pools"] = {"gpu": 2, "bad name": 2, "huge": HUGE, "light": 3, "zero": 0}
    client.set(keys.published_lanes, json.dumps(registry))
    client.set(keys.slot("gpu", 1).lease, ESCAPES + "{not json")
    client.rpush(keys.slot("gpu", 0).pressure, "a list")
    client.rpush(keys.journal, json.dumps(
        {"ev": "start", "lane": "x.heavy", "task": "p1", "fence": 5, "t": time.time() - 5,
         "pool": "gpu", "slots": [0, -1, "x", 10**9, 1]}))
    said = check_every_tool(tools)
    status = strict_json(said["json"])
    pools = {p["pool"]: p for p in status["pools"]}
    assert set(pools) == {"heavy", "gpu"}
    # The unreadable slot counts as busy, by nobody known: nothing is granted over it.
    assert pools["gpu"]["busy"] == 1 and pools["gpu"]["holders"][0]["holder"] == ""
    for bad in ("'bad name'", "'huge'", "'light'", "'zero'"):
        assert any(f"pool {bad}" in p for p in status["problems"]), (bad, status["problems"])
    assert any(keys.slot("gpu", 0).pressure in p for p in status["problems"])
    assert "pool gpu: 1/2 slots busy" in said["plain"]
    assert 'schedproj_pool_slots{pool="gpu"} 2.0' in said["/metrics"]
    # The journaled run is drawn on the slots that are slots of the pool (0 and 1) only.
    assert re.findall(r'data-task="p1"[^>]*data-slot="(\d+)"', said["/"]) == ["0", "1"]
