"""How ``KernelSaver`` stores a LangGraph checkpoint: a growing list by what is new in it.

LangGraph hands a saver every channel's whole value at every checkpoint. A chat's ``messages``
channel grows by a message or two a step, so storing it whole stores a conversation of n turns
in O(n^2) bytes. Here a channel's value at a checkpoint is stored as one of:

- ``["L", stream, length]`` (a ``list``) or ``["T", stream, length]`` (a ``str``): the first
  ``length`` items of a *stream*, the channel's items kept once each in records of their own, in
  a namespace beside the checkpoints' (``hidden_namespace``): each checkpoint's new items as a
  *piece*, a record written once, and every ``SEGMENT_ITEMS`` of them sealed into a *segment*
  (the pieces it holds are then deleted; no record is ever written over, which on PostgreSQL
  would leave a dead copy each time). A checkpoint whose list extends its parent's appends the
  new items to the parent's stream; one that extends a value some other checkpoint's stream already went on
  from (time travel, a fork) starts a stream of its own on top of that one (``base``). A
  string's items are the pieces it grew by. Whether a list extends its parent's is judged on
  the serializer's bytes of each item, so an item changed in place is never taken for the old
  one, and a value read back is made of the bytes the serializer produced.
- ``["o", value]``: anything else, whole, in the checkpoint's own record (serialized with it,
  in one pass, as before this encoding): a list or a string under ``STREAM_AT_LEAST`` bytes too
  (a stream costs records of its own), and any other value.

Reading a checkpoint reads its record and the stream records of its list channels (one query
per channel: the segments and the pieces since the last one): a number of queries that does
not grow with the conversation. Payloads of ``COMPRESS_AT_LEAST`` bytes or more are deflated
(``deflate``): the checkpoint's, the streams' and the pending writes' (these against their
checkpoint's body where the saver has it at hand: a graph's input, in the input checkpoint, is
repeated by the writes of the task that reads it). Smaller ones are not: a small graph's
checkpoints would pay for it at every step. A checkpoint's versions are kept as numbers
(``compacted``): as strings they were half of a small graph's checkpoint.

Streams belong to their thread: ``delete_thread`` removes them with it, ``copy_thread`` copies
them with it (their ids are kept). A delete of single checkpoints (``prune``,
``delete_for_runs``) deletes the stream records no checkpoint that stays reads.

A payload written before this encoding (``kind\\x00data`` of the whole checkpoint, uncompressed)
is read as it always was, and is compared against like any other.
"""

from __future__ import annotations

import zlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ringzero.core.contract.errors import CheckpointerError

MARK = b"rzlg2"
"""A payload's first bytes (before ``\\x00``) in this encoding; a serializer's kind otherwise."""
SEGMENT_ITEMS = 32
"""Items a segment holds: the pieces since the last segment are sealed into one at this many."""
STREAM_AT_LEAST = 4096
"""Bytes (serialized) from which a list or a string is kept in a stream rather than whole."""
COMPRESS_AT_LEAST = 1024
"""Bytes from which a payload is deflated."""
DICTIONARY_BYTES = 32768
"""The most of a preset dictionary deflate looks back into (its largest window)."""
HIDDEN = "\x1f"
"""In a namespace: the streams' (no LangGraph namespace holds it)."""

Typed = tuple[str, bytes]
INLINE = ["o"]
"""A ``Known`` spec: a child whose version is the same stores its value inline too."""


def hidden_namespace(namespace: str, channel: str) -> str:
    return f"{namespace}{HIDDEN}{channel}"


def is_hidden(namespace: str) -> bool:
    return HIDDEN in namespace


def segment_id(stream: str, index: int) -> str:
    """A full segment's record: items ``index * SEGMENT_ITEMS`` on, ``SEGMENT_ITEMS`` of them."""
    return f"{stream}.{index:06d}"


def piece_id(stream: str, position: int) -> str:
    """A piece's record: the items one checkpoint added, from ``position`` (in the stream's own)."""
    return f"{stream}.{position // SEGMENT_ITEMS:06d}.{position % SEGMENT_ITEMS:03d}"


def deflate(data: bytes, against: bytes | None = None) -> bytes:
    """Raw deflate with a 4 KiB window and small tables: as tight as zlib's defaults on a
    checkpoint's few kilobytes, in a seventh of the time (zlib.compress sets up 256 KiB of state
    for every call: 58 us for 700 bytes here, against 8). ``against``: bytes the reader has too,
    given to zlib as a preset dictionary (its last 32 KiB), so that what repeats them costs a
    few bytes (``Codec.typed``)."""
    if against is None:
        squeezer = zlib.compressobj(6, zlib.DEFLATED, -12, 4)
    else:
        squeezer = zlib.compressobj(6, zlib.DEFLATED, -15, 4, zlib.Z_DEFAULT_STRATEGY, against[-DICTIONARY_BYTES:])
    return squeezer.compress(data) + squeezer.flush()


def inflate(data: bytes, against: bytes | None = None) -> bytes:
    if against is None:
        return zlib.decompress(data, -15)
    unsqueezer = zlib.decompressobj(-15, against[-DICTIONARY_BYTES:])
    return unsqueezer.decompress(data) + unsqueezer.flush()


def pack(data: bytes) -> bytes:
    """``data`` with a flag in front: deflated (``d``) where it is worth it, else raw (``r``);
    every payload goes through it once (``Codec.typed``)."""
    if len(data) >= COMPRESS_AT_LEAST:
        squeezed = deflate(data)
        if len(squeezed) < len(data):
            return b"d" + squeezed
    return b"r" + data


@dataclass(frozen=True)
class Known:
    """One channel's value at a checkpoint, as the next checkpoint is compared against it."""

    channel_version: Any
    spec: list[Any]
    """What a child whose version is the same stores: a stream's spec, or ``INLINE``."""
    items: tuple[Typed, ...] | None = None
    """A list's items (a string's pieces), serialized one by one."""
    text: str | None = None
    """A string's value."""
    stream: str | None = None
    """The stream the value's items are in (None: stored whole)."""


KnownValues = dict[str, Known]


@dataclass
class Stream:
    """What a stream holds, for the next append to it: where it starts, how many items it has
    of its own, and the pieces written since its last full segment (sealed into one as it fills)."""

    base: tuple[str, int] | None
    stored: int
    pieces: list[tuple[str, list[Typed]]] = field(default_factory=list)
    """(record id, items) of the pieces after the last segment."""

    @property
    def end(self) -> int:
        return (self.base[1] if self.base else 0) + self.stored


@dataclass(frozen=True)
class Segment:
    """A stream record to write: in ``namespace``, id ``id``."""

    namespace: str
    id: str
    payload: bytes


@dataclass
class Body:
    """A record's payload, decoded: the checkpoint (without its values, in this encoding), its
    metadata, and per channel the spec above; ``specs`` is None for a payload of the old kind,
    whose ``checkpoint`` holds its ``channel_values``."""

    checkpoint: dict[str, Any]
    metadata: Any
    specs: dict[str, list[Any]] | None
    raw: bytes
    """The serializer's bytes of the record's payload (inflated): what its pending writes may
    have been deflated against (``Codec.typed``)."""


VERSION_TAIL = "." + "0" * 16
"""How the versions ``KernelSaver.get_next_version`` makes end: ``f"{n:032}.{0:016}"``."""


def compacted(checkpoint: Mapping[str, Any]) -> dict[str, Any]:
    """The checkpoint as its record's body holds it: without its values, and its versions (half
    of a small graph's checkpoint: six 49-character strings) as ``[name, n]`` pairs, ``n`` an
    int for a version ``get_next_version`` made, ``[version]`` for any other (an int version
    of another saver stays an int: ``expanded`` gives back exactly what was given)."""
    rest = {key: value for key, value in checkpoint.items() if key != "channel_values"}
    versions, seen = rest.pop("channel_versions", None), rest.pop("versions_seen", None)
    if type(versions) is dict:
        rest["cv"] = _pairs(versions)
    elif versions is not None:
        rest["channel_versions"] = versions
    if type(seen) is dict and all(type(by) is dict for by in seen.values()):
        rest["vs"] = [[node, _pairs(by)] for node, by in seen.items()]
    elif seen is not None:
        rest["versions_seen"] = seen
    return rest


def _pairs(versions: dict[str, Any]) -> list[list[Any]]:
    return [[channel, int(version[:32]) if type(version) is str and len(version) == 49
             and version.endswith(VERSION_TAIL) and version[:32].isascii() and version[:32].isdigit()
             else [version]] for channel, version in versions.items()]


def expanded(rest: dict[str, Any]) -> dict[str, Any]:
    """``compacted``'s checkpoint (values aside) as it was given."""
    if "cv" in rest:
        rest["channel_versions"] = _versions(rest.pop("cv"))
    if "vs" in rest:
        rest["versions_seen"] = {node: _versions(by) for node, by in rest.pop("vs")}
    return rest


def _versions(pairs: list[list[Any]]) -> dict[str, Any]:
    return {channel: f"{version:032}{VERSION_TAIL}" if type(version) is int else version[0]
            for channel, version in pairs}


class Codec:
    """Encodes checkpoints against what their parents store, and decodes them back."""

    def __init__(self, serde: Any) -> None:
        self.serde = serde

    # ------------------------------------------------------------------ plain values
    def typed(self, value: Any, against: bytes | None = None) -> bytes:
        """A value as the old payloads and pending writes hold it: its kind, ``\\x00``, its bytes
        (a kind ending in ``+d`` for bytes ``pack`` deflated). ``against``: the raw body of the
        checkpoint a pending write belongs to, where the saver has it at hand: a write of
        ``COMPRESS_AT_LEAST`` bytes is deflated against it (kind ending in ``+c``). A graph's
        input is both in its input checkpoint (the ``__start__`` channel) and in the writes of
        the task that reads it: so it is stored once, not twice."""
        kind, data = self.serde.dumps_typed(value)
        return self._packed(kind, data, against)

    def _packed(self, kind: str, data: bytes, against: bytes | None = None) -> bytes:
        if against is not None and len(data) >= COMPRESS_AT_LEAST:
            squeezed = deflate(bytes(data), against)
            if len(squeezed) < len(data):
                return f"{kind}+c".encode() + b"\x00" + squeezed
        packed = pack(bytes(data))
        if packed[:1] == b"d":
            return f"{kind}+d".encode() + b"\x00" + packed[1:]
        return str(kind).encode() + b"\x00" + bytes(data)

    def untyped(self, payload: bytes, against: bytes | None = None) -> Any:
        """A value ``typed`` made; ``against``: the raw body of the checkpoint of a pending write."""
        return self.serde.loads_typed(self._unpacked(payload, against))

    def _unpacked(self, payload: bytes, against: bytes | None = None) -> tuple[str, bytes]:
        kind, _, data = payload.partition(b"\x00")
        name = kind.decode()
        if name.endswith("+d"):
            return name[:-2], inflate(data)
        if name.endswith("+c"):
            if against is None:
                raise CheckpointerError(f"a value of kind {name!r} is read only with the checkpoint it was written to")
            return name[:-2], inflate(data, against)
        return name, data

    # ------------------------------------------------------------------ checkpoints
    def body(self, payload: bytes) -> Body:
        kind, _, data = payload.partition(b"\x00")
        if kind != MARK:
            raw_kind, raw = self._unpacked(payload)
            whole = self.serde.loads_typed((raw_kind, raw))
            return Body(whole["checkpoint"], whole["metadata"], None, raw)
        raw_kind, raw = self._unpacked(data)
        decoded = self.serde.loads_typed((raw_kind, raw))
        return Body(expanded(decoded["checkpoint"]), decoded["metadata"], decoded["values"], raw)

    def encode(self, place: tuple[str, str], checkpoint_id: str, checkpoint: Mapping[str, Any], metadata: Any,
               parent: KnownValues | None, streams: Streams) -> tuple[bytes, bytes, list[Segment],
                                                                      list[tuple[str, str]], KnownValues]:
        """The record's payload and its raw body (``Body.raw``), the stream records to write
        with it, the stream records (namespace, id) to delete after (pieces sealed into a
        segment), and what the next checkpoint is compared against."""
        specs: dict[str, list[Any]] = {}
        known: KnownValues = {}
        segments: list[Segment] = []
        gone: list[tuple[str, str]] = []
        versions = checkpoint.get("channel_versions", {})
        for channel, value in checkpoint.get("channel_values", {}).items():
            before = None if parent is None else parent.get(channel)
            version = versions.get(channel)
            if before is not None and version is not None and before.channel_version == version:
                specs[channel], known[channel] = ["o", value] if before.spec is INLINE else before.spec, before
                continue
            if type(value) is list or type(value) is str:
                spec, mine, written, deleted = self._growing(place, channel, checkpoint_id, value, version, before,
                                                             streams)
                segments += written
                gone += [(hidden_namespace(place[1], channel), record_id) for record_id in deleted]
            else:
                spec, mine = ["o", value], Known(version, INLINE)
            specs[channel], known[channel] = spec, mine
        rest = compacted(checkpoint)
        kind, raw = self.serde.dumps_typed({"checkpoint": rest, "metadata": metadata, "values": specs})
        return MARK + b"\x00" + self._packed(kind, raw), bytes(raw), segments, gone, known

    def _growing(self, place: tuple[str, str], channel: str, checkpoint_id: str, value: list[Any] | str,
                 version: Any, before: Known | None,
                 streams: Streams) -> tuple[list[Any], Known, list[Segment], list[str]]:
        """A list's or a string's spec: whole while it is small and in no stream, else in a stream."""
        serde = self.serde
        in_stream = before is not None and before.stream is not None
        if not in_stream and self._small(value):
            return ["o", value], Known(version, INLINE), [], []
        text = value if type(value) is str else None
        old = None if before is None else before.items
        if text is not None:  # a string's items: the pieces it grew by
            extends = old is not None and before is not None and before.text is not None \
                and text.startswith(before.text)
            if extends and old is not None and before is not None and before.text is not None:
                grown = text[len(before.text):]
                items: tuple[Typed, ...] = old + ((serde.dumps_typed(grown),) if grown else ())
            else:
                items = (serde.dumps_typed(text),)
        else:
            assert isinstance(value, list)
            items = tuple(serde.dumps_typed(item) for item in value)
            extends = old is not None and items[:len(old)] == old
            if extends and old is not None:
                items = old + items[len(old):]  # the parent's bytes objects, kept once
        tag = "T" if text is not None else "L"
        if not in_stream and sum(len(data) for _, data in items) < STREAM_AT_LEAST:
            return ["o", value], Known(version, INLINE, items=items, text=text), [], []
        if extends and old is not None and before is not None and before.stream is not None:
            stream = streams.get(place, channel, before.stream)
            if stream is not None and stream.end == len(old):  # this saver's stream, ending where the parent's does
                written, gone = streams.append(place, channel, before.stream, stream, items[len(old):], self)
                spec = [tag, before.stream, len(items)]
                return spec, Known(version, spec, items=items, text=text, stream=before.stream), written, gone
        # A stream of its own: on top of the parent's (a fork, time travel, another saver's), or from nothing.
        base = (before.stream, len(old)) if extends and old is not None and before is not None \
            and before.stream is not None else None
        stream = Stream(base, 0)
        written, gone = streams.append(place, channel, checkpoint_id, stream, items[base[1]:] if base else items,
                                       self)
        spec = [tag, checkpoint_id, len(items)]
        return spec, Known(version, spec, items=items, text=text, stream=checkpoint_id), written, gone

    def _small(self, value: Any) -> bool:
        """Whether a list or a string is well under ``STREAM_AT_LEAST`` bytes, judged without
        serializing it all: a string by its length, a list by its length and its last item's
        size (a chat's messages are alike; a list that is not, past half the bound, is weighed)."""
        if type(value) is str:
            return len(value) < STREAM_AT_LEAST // 2
        if not value:
            return True
        return len(value) * len(self.serde.dumps_typed(value[-1])[1]) < STREAM_AT_LEAST // 2

    def known_inline(self, value: Any, version: Any) -> Known:
        """What a child is compared against, for a value read whole: a list's or a long string's
        items weighed, so that it can go on in a stream."""
        if (type(value) is list or type(value) is str) and not self._small(value):
            if type(value) is str:
                return Known(version, INLINE, items=(self.serde.dumps_typed(value),), text=value)
            return Known(version, INLINE, items=tuple(self.serde.dumps_typed(item) for item in value))
        return Known(version, INLINE)

    def segment(self, namespace: str, record_id: str, base: tuple[str, int] | None,
                items: Sequence[Typed]) -> Segment:
        payload = self.typed({"base": list(base) if base else None,
                              "items": [[kind, data] for kind, data in items]})
        return Segment(namespace, record_id, payload)

    def segment_body(self, payload: bytes) -> tuple[tuple[str, int] | None, list[Typed]]:
        decoded = self.untyped(payload)
        base = decoded["base"]
        return (None if base is None else (str(base[0]), int(base[1])),
                [(str(kind), bytes(data)) for kind, data in decoded["items"]])


class Streams:
    """What the streams this saver made hold (bounded LRU), so that an append writes a piece (or
    seals a segment) without reading the stream back. A saver appends only to streams it made: one
    read from the store (another process's, or this one's before a restart) may have gone on
    there since, so a checkpoint that extends it starts a stream of its own on top of it. So two
    hosts on one store never write the same stream record, and a restart costs one stream more."""

    def __init__(self, size: int = 1024) -> None:
        self._size = size
        self._streams: OrderedDict[tuple[str, str, str, str], Stream] = OrderedDict()

    def get(self, place: tuple[str, str], channel: str, stream: str) -> Stream | None:
        key = (*place, channel, stream)
        found = self._streams.get(key)
        if found is not None:
            self._streams.move_to_end(key)
        return found

    def remember(self, place: tuple[str, str], channel: str, stream: str, state: Stream) -> None:
        key = (*place, channel, stream)
        self._streams[key] = state
        self._streams.move_to_end(key)
        while len(self._streams) > self._size:
            self._streams.popitem(last=False)

    def append(self, place: tuple[str, str], channel: str, stream_id: str, stream: Stream,
               items: Sequence[Typed], codec: Codec) -> tuple[list[Segment], list[str]]:
        """Add ``items`` to the stream: the records to write (a piece with them, or, where the
        pieces since the last segment fill one, that segment and a piece of what is left) and
        the pieces' records to delete once they are written."""
        namespace = hidden_namespace(place[1], channel)
        start = stream.stored
        stream.stored += len(items)
        self.remember(place, channel, stream_id, stream)
        if not items:
            return [], []
        first = start - sum(len(piece) for _, piece in stream.pieces)  # where the pieces start: a segment's start
        if stream.stored - first < SEGMENT_ITEMS:
            piece = (piece_id(stream_id, start), list(items))
            stream.pieces.append(piece)
            return [codec.segment(namespace, piece[0], stream.base, piece[1])], []
        pending = [item for _, piece in stream.pieces for item in piece] + list(items)
        sealed = len(pending) // SEGMENT_ITEMS * SEGMENT_ITEMS
        written = [codec.segment(namespace, segment_id(stream_id, (first + at) // SEGMENT_ITEMS), stream.base,
                                 pending[at:at + SEGMENT_ITEMS]) for at in range(0, sealed, SEGMENT_ITEMS)]
        gone = [record_id for record_id, _ in stream.pieces]
        stream.pieces = []
        if sealed < len(pending):
            piece = (piece_id(stream_id, first + sealed), pending[sealed:])
            stream.pieces.append(piece)
            written.append(codec.segment(namespace, piece[0], stream.base, piece[1]))
        return written, gone

    def forget(self, thread_id: str) -> None:
        for key in [key for key in self._streams if key[0] == thread_id]:
            del self._streams[key]


class Recent:
    """What the last checkpoints read or written store, per checkpoint id, for the next
    ``encode`` to compare against without reading them back, and the raw bodies of the last
    ones written that are worth deflating pending writes against (bounded LRUs)."""

    def __init__(self, size: int = 256) -> None:
        self._size = size
        self._known: OrderedDict[tuple[str, str, str], KnownValues] = OrderedDict()
        self._bodies: OrderedDict[tuple[str, str, str], bytes] = OrderedDict()

    def keep_body(self, thread_id: str, namespace: str, checkpoint_id: str, raw: bytes) -> None:
        """A checkpoint's raw body, where it may hold what its pending writes repeat (a value
        inline of ``COMPRESS_AT_LEAST`` bytes or more: a graph's input, in ``__start__``)."""
        if len(raw) < COMPRESS_AT_LEAST:
            return
        self._bodies[(thread_id, namespace, checkpoint_id)] = raw
        while len(self._bodies) > self._size // 16:
            self._bodies.popitem(last=False)

    def body(self, thread_id: str, namespace: str, checkpoint_id: str) -> bytes | None:
        return self._bodies.get((thread_id, namespace, checkpoint_id))

    def get(self, thread_id: str, namespace: str, checkpoint_id: str | None) -> KnownValues | None:
        if checkpoint_id is None:
            return None
        key = (thread_id, namespace, checkpoint_id)
        known = self._known.get(key)
        if known is not None:
            self._known.move_to_end(key)
        return known

    def put(self, thread_id: str, namespace: str, checkpoint_id: str, known: KnownValues) -> None:
        self._known[(thread_id, namespace, checkpoint_id)] = known
        self._known.move_to_end((thread_id, namespace, checkpoint_id))
        while len(self._known) > self._size:
            self._known.popitem(last=False)

    def forget(self, thread_id: str) -> None:
        for key in [key for key in self._known if key[0] == thread_id]:
            del self._known[key]
        for key in [key for key in self._bodies if key[0] == thread_id]:
            del self._bodies[key]


class Loaded:
    """The stream records of a thread's namespace read so far (per channel), and the values
    they rebuild."""

    def __init__(self, codec: Codec) -> None:
        self.codec = codec
        self.segments: dict[str, dict[str, dict[int, list[Typed]]]] = {}
        """channel -> stream -> segment index -> its items."""
        self.pieces: dict[str, dict[str, dict[int, list[Typed]]]] = {}
        """channel -> stream -> position -> the piece's items."""
        self.ids: dict[str, dict[str, list[str]]] = {}
        """channel -> stream -> its records' ids."""
        self.bases: dict[str, dict[str, tuple[str, int] | None]] = {}

    def has(self, channel: str) -> bool:
        return channel in self.segments

    def add_segments(self, channel: str, records: Sequence[tuple[str, bytes]]) -> None:
        segments = self.segments.setdefault(channel, {})
        pieces = self.pieces.setdefault(channel, {})
        ids = self.ids.setdefault(channel, {})
        bases = self.bases.setdefault(channel, {})
        for record_id, payload in records:
            stream, index, *offset = record_id.split(".")
            base, items = self.codec.segment_body(payload)
            if offset:
                pieces.setdefault(stream, {})[int(index) * SEGMENT_ITEMS + int(offset[0])] = items
            else:
                segments.setdefault(stream, {})[int(index)] = items
            ids.setdefault(stream, []).append(record_id)
            bases[stream] = base

    def reached(self, channel: str, streams: set[str]) -> set[str]:
        """``streams`` and every stream one of them is on top of."""
        reached: set[str] = set()
        for stream in streams:
            at: str | None = stream
            while at is not None and at not in reached:
                reached.add(at)
                base = self.bases.get(channel, {}).get(at)
                at = base[0] if base else None
        return reached

    def record_ids(self, channel: str, stream: str) -> list[str]:
        return list(self.ids.get(channel, {}).get(stream, []))

    def _own(self, channel: str, stream: str) -> list[Typed]:
        """The stream's own items, in order: full segments, then the pieces after them (a piece a
        segment already holds, left by a host that died before deleting it, is skipped)."""
        segments = self.segments.get(channel, {}).get(stream, {})
        pieces = self.pieces.get(channel, {}).get(stream, {})
        own: list[Typed] = []
        while True:
            at = len(own)
            if at % SEGMENT_ITEMS == 0 and at // SEGMENT_ITEMS in segments:
                own.extend(segments[at // SEGMENT_ITEMS])
            elif at in pieces:
                own.extend(pieces[at])
            else:
                return own

    def items(self, channel: str, stream: str, length: int) -> tuple[Typed, ...]:
        """The first ``length`` items of ``stream``, gathered back along its bases (no recursion)."""
        parts: list[list[Typed]] = []
        at: str | None = stream
        want = length
        while at is not None:
            if at not in self.ids.get(channel, {}):
                raise CheckpointerError(f"the {channel!r} items of stream {at!r} are not in the store")
            base = self.bases[channel].get(at)
            start = base[1] if base else 0
            own = self._own(channel, at)
            if want - start > len(own) or want < start:
                raise CheckpointerError(f"stream {at!r} of {channel!r} holds {start + len(own)} items, not {want}")
            parts.append(own[: want - start])
            at, want = (base[0], base[1]) if base else (None, 0)
        gathered: list[Typed] = []
        for part in reversed(parts):
            gathered.extend(part)
        return tuple(gathered)

    def value(self, channel: str, spec: list[Any], version: Any) -> tuple[Any, Known]:
        """A spec's value (new objects each call: a stream's items are decoded again, an inline
        value is the one its record was just decoded into), and its ``Known``."""
        serde = self.codec.serde
        if spec[0] == "o":
            return spec[1], self.codec.known_inline(spec[1], version)
        items = self.items(channel, spec[1], spec[2])
        decoded = [serde.loads_typed(item) for item in items]
        if spec[0] == "T":
            text = "".join(decoded)
            return text, Known(version, spec, items=items, text=text, stream=spec[1])
        return decoded, Known(version, spec, items=items, stream=spec[1])
