"""Lexical ranking (BM25) and cosine similarity, shared by tool search and long-term memory.

Words are lower-cased runs of letters or digits, with identifiers split at underscores and
case changes (``get_weatherForecast`` is ``get weather forecast``). Every index that ranks
text (this module's ``Bm25Index``, SQLite FTS5, PostgreSQL full-text) is fed these words, so
they all agree on what a word is.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from typing import Generic, TypeVar

from ringzero.core.contract.errors import InvalidArgument

__all__ = ["Bm25Index", "Embed", "bm25_scores", "cosine", "rank", "words"]

Embed = Callable[[Sequence[str]], Sequence[Sequence[float]]]
"""Texts to vectors: the embeddings option of tool search and memory search."""

K = TypeVar("K", bound=Hashable)

_WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")


def words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


class Bm25Index(Generic[K]):
    """An inverted index of documents by key, scored with BM25 (k1=1.2, b=0.75).

    Adding, replacing and removing a document costs its own words; a query touches only the
    documents that hold one of its words.
    """

    def __init__(self, k1: float = 1.2, b: float = 0.75) -> None:
        self.k1, self.b = k1, b
        self._postings: dict[str, dict[K, int]] = {}
        self._lengths: dict[K, int] = {}
        self._words: dict[K, tuple[str, ...]] = {}
        self._total = 0

    def __len__(self) -> int:
        return len(self._lengths)

    def add(self, key: K, text: str) -> None:
        """Index ``text`` under ``key``, replacing what ``key`` held."""
        self.remove(key)
        counts = Counter(words(text))
        for word, tf in counts.items():
            self._postings.setdefault(word, {})[key] = tf
        self._lengths[key] = sum(counts.values())
        self._words[key] = tuple(counts)
        self._total += self._lengths[key]

    def remove(self, key: K) -> None:
        length = self._lengths.pop(key, None)
        if length is None:
            return
        self._total -= length
        for word in self._words.pop(key):
            del self._postings[word][key]
            if not self._postings[word]:
                del self._postings[word]

    def scores(self, query: str) -> dict[K, float]:
        """BM25 score of every document holding a word of ``query`` (others score 0)."""
        n = len(self._lengths)
        average = self._total / n if n else 1.0
        found: dict[K, float] = {}
        for word in set(words(query)):
            posting = self._postings.get(word)
            if not posting:
                continue
            idf = math.log(1 + (n - len(posting) + 0.5) / (len(posting) + 0.5))
            for key, tf in posting.items():
                norm = 1 - self.b + self.b * self._lengths[key] / (average or 1.0)
                found[key] = found.get(key, 0.0) + idf * tf * (self.k1 + 1) / (tf + self.k1 * norm)
        return found


def bm25_scores(query: str, documents: Sequence[str]) -> list[float]:
    """One BM25 score per document for ``query`` (0.0 where no query word occurs)."""
    index: Bm25Index[int] = Bm25Index()
    for i, document in enumerate(documents):
        index.add(i, document)
    found = index.scores(query)
    return [found.get(i, 0.0) for i in range(len(documents))]


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=False))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm else 0.0


def rank(query: str, texts: Sequence[str], embed: Embed | None = None) -> list[float]:
    """One score per text: cosine similarity of embeddings when ``embed`` is given, else BM25."""
    if embed is None:
        return bm25_scores(query, texts)
    vectors = list(embed([query, *texts]))
    if len(vectors) != len(texts) + 1:
        raise InvalidArgument(f"embed returned {len(vectors)} vectors for {len(texts) + 1} texts")
    return [cosine(vectors[0], vector) for vector in vectors[1:]]
