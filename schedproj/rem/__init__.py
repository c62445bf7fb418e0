"""The REM chain's memory and work (DESIGN.md section 5), free of Celery.

* :mod:`schedproj.rem.store` — :class:`MemoryStore`, the fenced Redis store;
* :mod:`schedproj.rem.summarizer` — the pluggable summarizer (local extractive default);
* :mod:`schedproj.rem.work` — backfill, summarize, dream, golden path, heartbeat;
* :mod:`schedproj.rem.backup` — atomic JSON snapshots and restores;
* :mod:`schedproj.rem.seed` — the original's forensic situation, for the demo and tests.
"""

from __future__ import annotations

from schedproj.rem.store import MemoryStore, RemCounts, RemKeys
from schedproj.rem.summarizer import ExtractiveSummarizer, Summarizer, load_summarizer
from schedproj.rem.work import Progress

__all__ = [
    "ExtractiveSummarizer",
    "MemoryStore",
    "Progress",
    "RemCounts",
    "RemKeys",
    "Summarizer",
    "load_summarizer",
]
