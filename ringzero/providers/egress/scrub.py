"""Finding a run's secrets in what a server sends back, in every spelling a server makes.

A bound API that reflects its request (an echo, an error quoting the key, a 404 quoting the
path) would hand the code its secret. The value rarely comes back as the bytes that went out:
a server percent-encodes it, JSON-escapes it (``\\/``, ``\\u002B``), upper-cases it, quotes it
in an HTML entity, or cuts it short. So a response is searched for runs of characters each of
which is one of the secret's, written plainly (in either case) or in one of those escapes, and
any stretch of such a run that spells 8 or more consecutive characters of the secret (the whole
secret, where it is shorter) is shown to the code as the secret's placeholder. A code that pads
a request so a server's cut falls where it wants learns at most 7 characters from one end.

What cannot be caught: a server that transforms the value (base64, a hash, encryption) or
returns an arbitrary short slice of it on request (``Range`` on a reflecting endpoint). Bind a
secret only to the API it is for (SECURITY.md).

Text is matched as Latin-1 (one character per byte), so a body's bytes and a header's text are
scrubbed alike; a secret's value is matched as its UTF-8 bytes.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["RUN", "SecretScrub"]

RUN = 8
"""The shortest stretch of a secret's characters shown as its placeholder."""

_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}|\\u[0-9A-Fa-f]{4}|\\x[0-9A-Fa-f]{2}|\\/|&#[0-9]{1,7};|&#[xX][0-9A-Fa-f]{1,6};")


def _decoded(token: str) -> str:
    """The one character an escape stands for, lower-cased."""
    if token == "\\/":
        return "/"
    if token[0] == "%" or token[:2] == "\\x":
        code = int(token[-2:], 16)
    elif token[:2] == "\\u":
        code = int(token[2:], 16)
    elif token[:3] in ("&#x", "&#X"):
        code = int(token[3:-1], 16)
    else:
        code = int(token[2:-1])
    return chr(code).lower() if code < 0x110000 else "\0"


class SecretScrub:
    """Shows a run's secrets as their placeholders: ``text`` for a header, reason or message,
    ``data`` for a body."""

    def __init__(self, secrets: Mapping[str, str]) -> None:
        """``secrets`` maps a placeholder to the value it stands for."""
        self._secrets: list[tuple[str, int, frozenset[str], re.Pattern[str]]] = []
        for shown, value in secrets.items():
            spelled = value.encode("utf-8").decode("latin-1").lower()
            size = min(RUN, len(spelled))
            windows = frozenset(spelled[i:i + size] for i in range(len(spelled) - size + 1))
            self._secrets.append((shown, size, windows, re.compile("|".join(re.escape(w) for w in sorted(windows)))))

    def text(self, text: str) -> str:
        """``text`` with every stretch of a secret shown as its placeholder."""
        if not self._secrets:
            return text
        spelling = _Spelling(text)
        stretches = sorted(self._stretches(spelling.decoded), key=lambda s: (s[0], s[0] - s[1]))
        if not stretches:
            return text
        merged: list[list[Any]] = []
        for start, end, shown in stretches:
            start, end = spelling.original(start, end)
            if merged and start <= merged[-1][1]:  # touches the last one: one placeholder for both
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end, shown])
        out, done = [], 0
        for start, end, shown in merged:
            out.append(text[done:start] + shown)
            done = end
        out.append(text[done:])
        return "".join(out)

    def data(self, data: bytes) -> bytes:
        """A body, scrubbed as ``text`` is (byte for byte, as Latin-1)."""
        if not self._secrets:
            return data
        return self.text(data.decode("latin-1")).encode("latin-1", "replace")

    def _stretches(self, decoded: str) -> list[tuple[int, int, str]]:
        """``(start, end, placeholder)`` of each stretch of ``decoded`` that spells a secret."""
        found: list[tuple[int, int, str]] = []
        for shown, size, windows, pattern in self._secrets:
            start = 0
            while (hit := pattern.search(decoded, start)) is not None:
                at = end = hit.start()
                while end <= len(decoded) - size and decoded[end:end + size] in windows:
                    end += 1  # the stretch goes on while each next window is one of the secret's
                found.append((at, end + size - 1, shown))
                start = end
        return found


class _Spelling:
    """A text with its escapes decoded (lower-cased), and the way back to the text's offsets."""

    def __init__(self, text: str) -> None:
        self._decoded_at: list[int] = []  # where each piece starts in the decoded text
        self._pieces: list[tuple[int, int, bool]] = []  # (start in the text, end, an escape?)
        parts, done, size = [], 0, 0
        for escape in _ESCAPE.finditer(text):
            if escape.start() > done:
                self._piece(size, done, escape.start(), False)
                parts.append(text[done:escape.start()].lower())
                size += escape.start() - done
            self._piece(size, escape.start(), escape.end(), True)
            parts.append(_decoded(escape.group(0)))
            size += 1
            done = escape.end()
        if not self._pieces:
            self.decoded = text.lower()
            return
        if done < len(text):
            self._piece(size, done, len(text), False)
            parts.append(text[done:].lower())
        self.decoded = "".join(parts)

    def _piece(self, decoded_at: int, start: int, end: int, escape: bool) -> None:
        self._decoded_at.append(decoded_at)
        self._pieces.append((start, end, escape))

    def original(self, start: int, end: int) -> tuple[int, int]:
        """The text's offsets of the decoded stretch ``[start, end)``."""
        if not self._pieces:
            return start, end
        return self._at(start, first=True), self._at(end - 1, first=False)

    def _at(self, position: int, *, first: bool) -> int:
        index = bisect.bisect_right(self._decoded_at, position) - 1
        start, end, escape = self._pieces[index]
        if escape:
            return start if first else end
        offset = start + position - self._decoded_at[index]
        return offset if first else offset + 1
