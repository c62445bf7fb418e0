"""Summarizers: the model the REM chain calls, behind a two-method protocol.

The default, :class:`ExtractiveSummarizer`, runs locally with no network and is deterministic:
the same input always gives the same summary, which keeps the chain testable and the demo
reproducible. A real model plugs in through ``SCHEDPROJ_REM_SUMMARIZER=package.module:attr``.
"""

from __future__ import annotations

import importlib
import inspect
import math
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any, Protocol, cast, runtime_checkable

from schedproj.core.errors import ConfigurationError
from schedproj.rem.text import content_words, sentences

#: The setting that names the summarizer; quoted in every error about it.
SETTING = "SCHEDPROJ_REM_SUMMARIZER"
#: The value (besides unset) that selects the built-in summarizer.
DEFAULT_SPEC = "extractive"


@runtime_checkable
class Summarizer(Protocol):
    """What the REM lanes need from a model."""

    def summarize_turn(self, text: str) -> str:
        """A one-sentence mini-summary of one turn."""
        ...

    def summarize(self, texts: Sequence[str], max_sentences: int) -> str:
        """A summary of several texts in at most ``max_sentences`` sentences."""
        ...


class ExtractiveSummarizer:
    """Picks the input's most representative sentences.

    A sentence scores the summed frequency (over the whole input) of its distinct content words,
    divided by the square root of its content-word count, so long sentences do not win just by
    being long. The top ``max_sentences`` are returned in their original order; equal scores go
    to the earlier sentence. Repeated sentences count once.
    """

    def __init__(self, latency_s: float = 0.0) -> None:
        if latency_s < 0 or not math.isfinite(latency_s):
            raise ConfigurationError(
                f"summarizer latency must be a finite number of seconds >= 0, got {latency_s!r}"
            )
        #: Sleep per call, to let the demo behave like a multi-second model inference.
        self.latency_s = latency_s

    def summarize_turn(self, text: str) -> str:
        return self.summarize([text], 1)

    def summarize(self, texts: Sequence[str], max_sentences: int) -> str:
        if max_sentences < 1:
            raise ValueError(f"max_sentences must be >= 1, got {max_sentences}")
        self._simulate_latency()
        unique: list[str] = []
        seen: set[str] = set()
        for text in texts:
            for sentence in sentences(text):
                if sentence not in seen:
                    seen.add(sentence)
                    unique.append(sentence)
        if len(unique) <= max_sentences:
            return " ".join(unique)
        freq = Counter(w for s in unique for w in content_words(s))
        ranked = sorted(range(len(unique)), key=lambda i: (-_score(unique[i], freq), i))
        return " ".join(unique[i] for i in sorted(ranked[:max_sentences]))

    def _simulate_latency(self) -> None:
        if self.latency_s > 0:
            time.sleep(self.latency_s)


def _score(sentence: str, freq: Counter[str]) -> float:
    words = content_words(sentence)
    if not words:
        return 0.0
    return sum(freq[w] for w in set(words)) / math.sqrt(len(words))


def load_summarizer(spec: str | None, latency_s: float = 0.0) -> Summarizer:
    """The summarizer named by ``spec`` (the value of ``SCHEDPROJ_REM_SUMMARIZER``).

    ``None``, ``""`` or ``"extractive"`` give :class:`ExtractiveSummarizer`. ``"pkg.mod:attr"``
    imports ``attr`` from ``pkg.mod``; a class or factory is called (with ``latency_s=`` when
    it accepts that keyword), an object is used as is. The result must have both methods.
    """
    if spec is None or spec.strip() in ("", DEFAULT_SPEC):
        return ExtractiveSummarizer(latency_s)
    target = _import(spec.strip())
    made = _instantiate(spec, target, latency_s) if callable(target) else target
    missing = [m for m in ("summarize_turn", "summarize") if not callable(getattr(made, m, None))]
    if missing:
        raise ConfigurationError(
            f"{SETTING}={spec!r} gave a {type(made).__name__} without the method(s) "
            f"{', '.join(missing)}. Fix: point it at a class or factory whose objects define "
            f"summarize_turn(text) and summarize(texts, max_sentences), or unset it for the "
            f"built-in extractive summarizer"
        )
    return cast(Summarizer, made)


def _import(spec: str) -> Any:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigurationError(
            f"{SETTING}={spec!r} is not 'package.module:attr'. Fix: set it to "
            f"'{DEFAULT_SPEC}' or to 'package.module:attr' naming a summarizer class or factory"
        )
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any import-time failure is a configuration problem
        raise ConfigurationError(
            f"{SETTING}={spec!r}: cannot import module {module_name!r} "
            f"({type(exc).__name__}: {exc}). Fix: install the package or correct the module path"
        ) from exc
    target = module
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ConfigurationError(
                f"{SETTING}={spec!r}: module {module_name!r} has no attribute {attr!r}. "
                f"Fix: name a class or factory defined there"
            ) from None
    return target


def _instantiate(spec: str, factory: Any, latency_s: float) -> Any:
    kwargs: dict[str, float] = {}
    try:
        if "latency_s" in inspect.signature(factory).parameters:
            kwargs["latency_s"] = latency_s
    except (TypeError, ValueError):  # builtins without a signature: call with no arguments
        pass
    try:
        return factory(**kwargs)
    except Exception as exc:
        raise ConfigurationError(
            f"{SETTING}={spec!r}: calling it failed ({type(exc).__name__}: {exc}). "
            f"Fix: make it callable with no arguments (or with latency_s=)"
        ) from exc
