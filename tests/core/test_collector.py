"""core.collector: the cyclic collector paused for a burst, and given back as it was."""

from __future__ import annotations

import gc

import pytest

from schedproj.core.collector import cyclic_gc_paused


def test_paused_inside_and_back_after_even_on_an_error() -> None:
    assert gc.isenabled()
    with cyclic_gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(ValueError), cyclic_gc_paused():
        raise ValueError("in the burst")
    assert gc.isenabled()


def test_a_block_inside_another_leaves_it_off_for_the_outer_one() -> None:
    with cyclic_gc_paused():
        with cyclic_gc_paused():
            pass
        assert not gc.isenabled()
    assert gc.isenabled()


def test_left_off_when_it_was_off_before() -> None:
    gc.disable()
    try:
        with cyclic_gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
