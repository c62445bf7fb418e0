"""FamilyStore checks the family's name itself (the README's Python API), with the rule the
CLI relies on: a malformed name writes nothing."""

from __future__ import annotations

import pytest
import redis

from schedproj.core.families import FamilyError
from schedproj.store.families import FamilyStore
from schedproj.store.protocol import Keys


@pytest.mark.parametrize("name", ["evil*{fam}[", "", "a]b", "x|run", "two words", "tab\t",
                                  "a" * 200, None, 5])
def test_a_malformed_family_name_is_refused_and_writes_nothing(
        client: redis.Redis, keys: Keys, key_prefix: str, name: object) -> None:
    before = set(client.scan_iter(f"{key_prefix}:*"))
    store = FamilyStore(client, keys)
    for call in (lambda: store.add(name, ["a"]),  # type: ignore[arg-type]
                 lambda: store.remove(name, ["a"]),  # type: ignore[arg-type]
                 lambda: store.sync(name, ["a"]),  # type: ignore[arg-type]
                 lambda: store.members(name)):  # type: ignore[arg-type]
        with pytest.raises(FamilyError) as refused:
            call()
        assert "Fix:" in str(refused.value)
    assert set(client.scan_iter(f"{key_prefix}:*")) == before


def test_a_well_formed_undeclared_name_is_taken_and_a_declared_one_always(
        client: redis.Redis, keys: Keys) -> None:
    assert FamilyStore(client, keys).add("repo.sync", ["acme/web"]) == 1
    # A declared family passed the lane declaration's own checks: its name is taken as is.
    declared = FamilyStore(client, keys, ["my lanes.sync"])
    assert declared.add("my lanes.sync", ["k"]) == 1
    with pytest.raises(FamilyError):
        declared.add("repo.sync", ["k"])  # well formed, but not declared here
