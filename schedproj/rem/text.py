"""Words and sentences, the way every REM step sees them.

One tokenizer for the summarizer, the dream and the golden path, so "a content word" means the
same thing when a summary is written, when it is digested and when the graph is scored.
"""

from __future__ import annotations

import re
from collections import Counter

#: Small, fixed English stop-word list. Fixed (not from a library) so results never change when
#: a dependency updates its list.
STOP_WORDS: frozenset[str] = frozenset({
    "a", "about", "above", "after", "again", "against", "all", "also", "am", "an", "and", "any",
    "are", "as", "at", "be", "because", "been", "before", "being", "below", "between", "both",
    "but", "by", "can", "could", "did", "do", "does", "doing", "done", "down", "during", "each",
    "else", "even", "ever", "every", "few", "for", "from", "further", "get", "gets", "got", "had",
    "has", "have", "having", "he", "her", "here", "hers", "herself", "him", "himself", "his",
    "how", "however", "i", "if", "in", "into", "is", "it", "its", "itself", "just", "least",
    "less", "let", "like", "made", "make", "many", "may", "me", "might", "more", "most", "much",
    "must", "my", "myself", "no", "nor", "not", "now", "of", "off", "often", "on", "once", "one",
    "only", "or", "other", "others", "our", "ours", "ourselves", "out", "over", "own", "per",
    "perhaps", "quite", "rather", "really", "same", "say", "says", "see", "seen", "she", "should",
    "since", "so", "some", "still", "such", "than", "that", "the", "their", "theirs", "them",
    "themselves", "then", "there", "these", "they", "this", "those", "though", "through", "thus",
    "to", "too", "under", "until", "up", "upon", "us", "very", "via", "was", "we", "well", "were",
    "what", "when", "where", "whether", "which", "while", "who", "whom", "whose", "why", "will",
    "with", "within", "without", "would", "yet", "you", "your", "yours", "yourself", "yourselves",
})

#: Content words are at least this long: shorter tokens are mostly noise ("ok", "id").
MIN_WORD_LEN = 3

_WORD = re.compile(r"[a-z][a-z0-9']*")
# A sentence ends at . ! or ? followed by whitespace, or at a line break.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")


def sentences(text: str) -> list[str]:
    """The non-empty sentences of ``text``, stripped, in order."""
    return [s.strip() for s in _SENTENCE_END.split(text) if s.strip()]


def content_words(text: str) -> list[str]:
    """Lower-cased words of ``text`` that are not stop words, in order (repeats kept)."""
    words = (w.strip("'") for w in _WORD.findall(text.lower()))
    return [w for w in words if len(w) >= MIN_WORD_LEN and w not in STOP_WORDS]


def word_count(text: str) -> int:
    """Whitespace-separated words: what counts against the model's context window."""
    return len(text.split())


def bag_of_words(text: str) -> Counter[str]:
    return Counter(content_words(text))


def top_terms(text: str, n: int) -> list[tuple[str, int]]:
    """The ``n`` most frequent content words with their counts; ties go alphabetically."""
    counts = bag_of_words(text)
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
