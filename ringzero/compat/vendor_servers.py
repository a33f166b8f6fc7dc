"""HTTP servers on 127.0.0.1 that speak OpenAI's and Anthropic's wire formats: the LLM kit's own
(``ringzero.compat.llm``, for providers that speak either) and ringzero's provider tests'.

Each checks an incoming request the way the vendor's API does (headers, required fields,
every tool result answering a tool call of the turn before) and refuses a malformed one with
the vendor's own 400 error body. A valid request gets the next reply of the test's script:
a vendor-shaped answer made by the helpers below, an error, or a function of the request.
Every request is kept in ``requests``.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

Vendor = Literal["openai", "anthropic"]


@dataclass
class Reply:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    cut: Literal["reset", "truncate"] | None = None
    """``reset``: the connection is reset (RST) halfway through the body; ``truncate``: the
    body is cut in half and sent as if whole (a shorter content-length), so it is not JSON."""


@dataclass
class Stream:
    """A streamed answer: server-sent events written one at a time. After ``hold_after`` of them
    the server waits for ``release`` (the test sets it once it has the text so far) for up to
    10 s, and notes in ``waited_out`` whether it had to give up waiting; ``reset_after`` resets
    the connection after that many events instead of finishing."""

    events: list[tuple[str | None, Any]]
    hold_after: int | None = None
    release: threading.Event = field(default_factory=threading.Event)
    waited_out: bool = False
    reset_after: int | None = None


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


Script = list[Reply | Stream | Callable[[dict[str, Any]], Reply | Stream]]


# ---------------------------------------------------------------- answers in each vendor's shape
def openai_answer(content: str | None = "", tool_calls: list[tuple[str, str, dict[str, Any]]] = (),  # type: ignore[assignment]
                  usage: tuple[int, int] = (12, 5), finish: str | None = None, model: str = "gpt-test") -> Reply:
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
    if tool_calls:
        message["tool_calls"] = [{"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
                                 for i, n, a in tool_calls]
    return Reply(200, {"id": "chatcmpl-1", "object": "chat.completion", "created": int(time.time()), "model": model,
                       "choices": [{"index": 0, "message": message, "logprobs": None,
                                    "finish_reason": finish or ("tool_calls" if tool_calls else "stop")}],
                       "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1],
                                 "total_tokens": sum(usage)}})


def openai_stream(pieces: list[str], tool_calls: list[tuple[str, str, dict[str, Any]]] = (),  # type: ignore[assignment]
                  usage: tuple[int, int] = (12, 5), **options: Any) -> Stream:
    """OpenAI's chunks: a role chunk, a chunk per piece of text, each tool call's name and then its
    arguments in two halves, the finish reason, the usage in a chunk of its own, and ``[DONE]``."""
    def chunk(delta: dict[str, Any] | None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
        choices = [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
        return {"id": "chatcmpl-9", "object": "chat.completion.chunk", "created": 1, "model": "gpt-test",
                "choices": choices, **extra}

    events: list[tuple[str | None, Any]] = [(None, chunk({"role": "assistant", "content": ""}))]
    events += [(None, chunk({"content": piece})) for piece in pieces]
    for index, (call_id, name, arguments) in enumerate(tool_calls):
        raw = json.dumps(arguments)
        events.append((None, chunk({"tool_calls": [{"index": index, "id": call_id, "type": "function",
                                                     "function": {"name": name, "arguments": raw[:5]}}]})))
        events.append((None, chunk({"tool_calls": [{"index": index, "function": {"arguments": raw[5:]}}]})))
    events.append((None, chunk({}, "tool_calls" if tool_calls else "stop")))
    events.append((None, chunk(None, usage={"prompt_tokens": usage[0], "completion_tokens": usage[1],
                                           "total_tokens": sum(usage)})))
    events.append((None, "[DONE]"))
    return Stream(events, **options)


def anthropic_stream(pieces: list[str], tool_uses: list[tuple[str, str, dict[str, Any]]] = (),  # type: ignore[assignment]
                     usage: tuple[int, int] = (12, 5), **options: Any) -> Stream:
    """Anthropic's events: message_start, a text block delta by delta (a ping among them), each
    tool_use block with its input JSON in two halves, message_delta with the stop reason and
    output tokens, message_stop."""
    events: list[tuple[str | None, Any]] = [("message_start", {"type": "message_start", "message": {
        "id": "msg_9", "type": "message", "role": "assistant", "model": "claude-test", "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": usage[0], "output_tokens": 1}}})]
    index = 0
    if pieces:
        events.append(("content_block_start", {"type": "content_block_start", "index": 0,
                                               "content_block": {"type": "text", "text": ""}}))
        events.append(("ping", {"type": "ping"}))
        events += [("content_block_delta", {"type": "content_block_delta", "index": 0,
                                            "delta": {"type": "text_delta", "text": piece}}) for piece in pieces]
        events.append(("content_block_stop", {"type": "content_block_stop", "index": 0}))
        index = 1
    for offset, (call_id, name, arguments) in enumerate(tool_uses):
        at, raw = index + offset, json.dumps(arguments)
        events.append(("content_block_start", {"type": "content_block_start", "index": at, "content_block": {
            "type": "tool_use", "id": call_id, "name": name, "input": {}}}))
        events += [("content_block_delta", {"type": "content_block_delta", "index": at,
                                            "delta": {"type": "input_json_delta", "partial_json": half}})
                   for half in (raw[:5], raw[5:])]
        events.append(("content_block_stop", {"type": "content_block_stop", "index": at}))
    events.append(("message_delta", {"type": "message_delta", "delta": {
        "stop_reason": "tool_use" if tool_uses else "end_turn", "stop_sequence": None},
        "usage": {"output_tokens": usage[1]}}))
    events.append(("message_stop", {"type": "message_stop"}))
    return Stream(events, **options)


def openai_error(status: int, message: str, kind: str, code: str | None = None, headers: dict[str, str] | None = None,
                 ) -> Reply:
    return Reply(status, {"error": {"message": message, "type": kind, "param": None, "code": code}}, headers or {})


def anthropic_answer(text: str = "", tool_uses: list[tuple[str, str, dict[str, Any]]] = (),  # type: ignore[assignment]
                     usage: tuple[int, int] = (12, 5), stop: str | None = None, model: str = "claude-test",
                     cache_read: int = 0, thinking: list[dict[str, Any]] = ()) -> Reply:  # type: ignore[assignment]
    content: list[dict[str, Any]] = list(thinking)
    content += [{"type": "text", "text": text}] if text else []
    content += [{"type": "tool_use", "id": i, "name": n, "input": a} for i, n, a in tool_uses]
    return Reply(200, {"id": "msg_1", "type": "message", "role": "assistant", "model": model, "content": content,
                       "stop_reason": stop or ("tool_use" if tool_uses else "end_turn"), "stop_sequence": None,
                       "usage": {"input_tokens": usage[0], "output_tokens": usage[1],
                                 "cache_creation_input_tokens": 0, "cache_read_input_tokens": cache_read}})


def anthropic_error(status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> Reply:
    return Reply(status, {"type": "error", "error": {"type": kind, "message": message}}, headers or {})


# ---------------------------------------------------------------- what each API refuses
def openai_problem(headers: dict[str, str], body: dict[str, Any]) -> Reply | None:
    if not isinstance(body.get("model"), str) or not isinstance(body.get("messages"), list) or not body["messages"]:
        return openai_error(400, "'model' and a non-empty 'messages' are required", "invalid_request_error")
    open_calls: set[str] = set()
    for i, message in enumerate(body["messages"]):
        role = message.get("role")
        if role not in ("system", "developer", "user", "assistant", "tool"):
            return openai_error(400, f"Invalid value for 'messages[{i}].role': {role!r}", "invalid_request_error")
        if role == "assistant":
            open_calls = {c["id"] for c in message.get("tool_calls") or ()}
            for call in message.get("tool_calls") or ():
                if call.get("type") != "function" or not isinstance(call["function"].get("arguments"), str):
                    return openai_error(400, f"messages[{i}].tool_calls: arguments must be a JSON string",
                                        "invalid_request_error")
        elif role == "tool":
            if message.get("tool_call_id") not in open_calls:
                return openai_error(400, "messages with role 'tool' must be a response to a preceeding message "
                                    "with 'tool_calls'.", "invalid_request_error")
        elif not isinstance(message.get("content"), str):
            return openai_error(400, f"messages[{i}].content must be a string", "invalid_request_error")
    for tool in body.get("tools") or ():
        if tool.get("type") != "function" or "name" not in tool.get("function", {}):
            return openai_error(400, "tools[].function.name is required", "invalid_request_error")
    return None


def anthropic_problem(headers: dict[str, str], body: dict[str, Any]) -> Reply | None:
    if not headers.get("x-api-key"):
        return anthropic_error(401, "authentication_error", "x-api-key header is required")
    if not headers.get("anthropic-version"):
        return anthropic_error(400, "invalid_request_error", "anthropic-version: header is required")
    if not isinstance(body.get("max_tokens"), int):
        return anthropic_error(400, "invalid_request_error", "max_tokens: Field required")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or messages[0].get("role") != "user":
        return anthropic_error(400, "invalid_request_error", "messages: the first message must use the user role")
    previous_tool_uses: set[str] = set()
    for i, message in enumerate(messages):
        role, content = message.get("role"), message.get("content")
        if role not in ("user", "assistant"):
            return anthropic_error(400, "invalid_request_error", f"messages.{i}.role: Input should be 'user' or "
                                   "'assistant' (system prompts go in the top-level system field)")
        if i and messages[i - 1]["role"] == role:
            return anthropic_error(400, "invalid_request_error", "messages: roles must alternate between user "
                                   "and assistant")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not blocks:
            return anthropic_error(400, "invalid_request_error", f"messages.{i}: all messages must have non-empty "
                                   "content")
        for block in blocks:
            if block.get("type") == "text" and not block.get("text"):
                return anthropic_error(400, "invalid_request_error", "text content blocks must be non-empty")
            if block.get("type") == "tool_result" and block.get("tool_use_id") not in previous_tool_uses:
                return anthropic_error(400, "invalid_request_error", f"messages.{i}: unexpected tool_use_id found "
                                       "in tool_result blocks; each tool_result must answer a tool_use of the "
                                       "previous message")
        previous_tool_uses = {b["id"] for b in blocks if b.get("type") == "tool_use"}
    return None


# ---------------------------------------------------------------- the server
class _QuietServer(ThreadingHTTPServer):
    request_queue_size = 128  # the listen backlog: the stdlib's 5 refuses a burst of new connections

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away mid-request (a timeout, a killed host) is not an error here."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class VendorServer:
    def __init__(self, vendor: Vendor, script: Script) -> None:
        self.vendor = vendor
        self.script = list(script)
        self.requests: list[Seen] = []
        self._lock = threading.Lock()
        self._http = _QuietServer(("127.0.0.1", 0), self._handler())
        self._http.daemon_threads = True

    @property
    def url(self) -> str:
        """The base URL a provider takes (``.../v1`` for OpenAI, the host for Anthropic)."""
        port = self._http.server_address[1]
        return f"http://127.0.0.1:{port}" + ("/v1" if self.vendor == "openai" else "")

    def refusal(self, path: str, headers: dict[str, str], body: dict[str, Any]) -> Reply | None:
        """What the vendor's API answers a request it refuses (a wrong route, a malformed body)."""
        expected = "/v1/chat/completions" if self.vendor == "openai" else "/v1/messages"
        if path.partition("?")[0] != expected:  # a query is the SDK's (the beta client's ?beta=true)
            return Reply(404, {"error": {"message": f"no route {path}", "type": "not_found_error"}})
        return (openai_problem if self.vendor == "openai" else anthropic_problem)(headers, body)

    def answer(self, path: str, headers: dict[str, str], body: dict[str, Any]) -> Reply | Stream:
        problem = self.refusal(path, headers, body)
        if problem is not None:
            return problem
        with self._lock:
            self.requests.append(Seen(path, headers, body))
            if not self.script:
                return Reply(500, {"error": {"message": "the test's script is exhausted", "type": "api_error"}})
            step = self.script.pop(0)
        reply = step(body) if callable(step) else step
        if isinstance(reply, Stream) != bool(body.get("stream")) and (isinstance(reply, Stream) or reply.status < 400):
            return Reply(400, {"error": {"message": f"the test's script answers stream={isinstance(reply, Stream)}"
                                         f" here, the request asked stream={body.get('stream')}",
                                         "type": "invalid_request_error"}})
        if isinstance(reply, Stream) and self.vendor == "openai" and \
                not (body.get("stream_options") or {}).get("include_usage"):
            return Reply(400, {"error": {"message": "a streamed request here must ask for its usage",
                                         "type": "invalid_request_error"}})
        return reply

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True
            """Headers and body go out as two writes; with Nagle's algorithm on, the body waited for
            the client's delayed ACK of the headers, 40 ms a call."""

            def do_POST(self) -> None:  # the stdlib names the handler so
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                try:
                    body = json.loads(raw)
                except ValueError:
                    reply = Reply(400, {"error": {"message": "body is not JSON", "type": "invalid_request_error"}})
                else:
                    answer = server.answer(self.path, headers, body)
                    if isinstance(answer, Stream):
                        self.stream(answer)
                        return
                    reply = answer
                time.sleep(reply.delay)
                data = json.dumps(reply.body).encode()
                length = len(data)
                if reply.cut == "truncate":
                    data = data[: len(data) // 2]
                    length = len(data)
                try:
                    self.send_response(reply.status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(length))
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    if reply.cut == "reset":
                        self.wfile.write(data[: len(data) // 2])
                        self.wfile.flush()
                        # SO_LINGER with a zero timeout: close() sends RST, not FIN.
                        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                        self.close_connection = True
                        self.connection.close()
                        return
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test)

            def stream(self, stream: Stream) -> None:
                """Write the events one chunk each, flushed, with the waits ``stream`` asks for."""
                try:
                    self.send_response(200)
                    self.send_header("content-type", "text/event-stream; charset=utf-8")
                    self.send_header("transfer-encoding", "chunked")
                    self.end_headers()
                    for sent, (name, data) in enumerate(stream.events):
                        if sent == stream.hold_after:
                            stream.waited_out = not stream.release.wait(10)
                        if sent == stream.reset_after:
                            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                            self.close_connection = True
                            self.connection.close()
                            return
                        text = data if isinstance(data, str) else json.dumps(data)
                        frame = (f"event: {name}\n" if name else "") + f"data: {text}\n\n"
                        raw = frame.encode()
                        self.wfile.write(f"{len(raw):x}\r\n".encode() + raw + b"\r\n")
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up

            def finish(self) -> None:
                with contextlib.suppress(OSError, ValueError):  # a connection reset on purpose (``Reply.cut``)
                    super().finish()

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet: the tests read ``requests`` instead."""

        return Handler

    @contextmanager
    def running(self) -> Iterator[VendorServer]:
        thread = threading.Thread(target=self._http.serve_forever, args=(0.02,), daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._http.shutdown()
            self._http.server_close()
            thread.join(5)


@contextmanager
def vendor_server(vendor: Vendor, script: Script) -> Iterator[VendorServer]:
    with VendorServer(vendor, script).running() as server:
        yield server


def openai_model(script: Callable[[Any], str]) -> Callable[[dict[str, Any]], Reply]:
    """A server step that answers as ``script`` (a ScriptedProvider-style function of an LLMRequest)."""
    from ringzero.core.contract.types import LLMRequest, Message

    def step(body: dict[str, Any]) -> Reply:
        messages = tuple(Message(m["role"], m.get("content") or "") for m in body["messages"] if m["role"] != "tool")
        return openai_answer(script(LLMRequest(messages=messages)))

    return step
