"""Lexical ranking (BM25) and cosine similarity, shared by tool search and long-term memory.

Words are lower-cased runs of letters or digits, with identifiers split at underscores and
case changes (``get_weatherForecast`` is ``get weather forecast``).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Sequence

__all__ = ["Embed", "bm25_scores", "cosine", "words"]

Embed = Callable[[Sequence[str]], Sequence[Sequence[float]]]
"""Texts to vectors: the embeddings option of tool search and memory search."""

_WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")


def words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


def bm25_scores(query: str, documents: Sequence[str], k1: float = 1.2, b: float = 0.75) -> list[float]:
    """One BM25 score per document for ``query`` (0.0 where no query word occurs)."""
    if not documents:
        return []
    tokenized = [words(document) for document in documents]
    average = sum(map(len, tokenized)) / len(tokenized) or 1.0
    frequency = Counter(word for document in tokenized for word in set(document))
    wanted = set(words(query))
    scores = []
    for document in tokenized:
        counts, score = Counter(document), 0.0
        for word in wanted:
            tf = counts.get(word, 0)
            if not tf:
                continue
            idf = math.log(1 + (len(tokenized) - frequency[word] + 0.5) / (frequency[word] + 0.5))
            score += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len(document) / average))
        scores.append(score)
    return scores


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=False))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm else 0.0
