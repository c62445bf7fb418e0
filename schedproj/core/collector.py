"""Python's cyclic garbage collector held off while a burst of short-lived objects is made.

A beat tick that ranks 10,000 due lanes, and a simulation that makes millions of decisions,
build views, deferrals and records by the hundred thousand and free them by their reference
counts: they make almost no cyclic garbage. Yet every 700 allocations the collector runs, and
every tenth and hundredth run walks every object that survived earlier ones (the due lanes'
states beat keeps between ticks, the simulator's lanes and traces). Those walks find nothing
and were a fifth of a ranking tick at 100,000 lanes and a quarter of a simulation's CPU. With
the collector off for the burst, the objects still alive at its end are walked once, by the
first collection after it; cycles made meanwhile (an exception's traceback, say) are
collected then, not lost.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """The cyclic collector off inside the block, back as it was after (a block inside
    another leaves it off for the outer one)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
