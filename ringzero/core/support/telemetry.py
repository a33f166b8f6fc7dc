"""OpenTelemetry traces and metrics for the kernel (``pip install ringzero[otel]``).

The library uses only opentelemetry-api, as libraries should: the SDK, its exporters and
where they send are the application's choice. A kernel finds the tracer and meter providers
when it starts (``Kernel(tracer_provider=..., meter_provider=...)``, else the global ones an
application set with ``trace.set_tracer_provider``); with neither, or without the package,
``kernel.telemetry`` is None and the kernel's syscalls call ``NoTelemetry``, whose methods do
nothing: one syscall path either way.

What is recorded:

- a span per process, ``invoke_agent {name}`` (GenAI conventions' agent span), from its
  start to its end, with the default provider's ``gen_ai.provider.name``, pid, name,
  priority, final status and stop reason; it is the current span inside the process's task,
  so spans a graph or a crew makes there nest under it;
- a child span per syscall made live: ``chat {model}`` for ``ctx.llm`` (GenAI attributes:
  ``gen_ai.operation.name``, ``gen_ai.provider.name``, ``gen_ai.request.model``,
  ``gen_ai.response.model``, ``gen_ai.response.id``, ``gen_ai.usage.input_tokens``/
  ``output_tokens``, ``gen_ai.response.finish_reasons``, ``server.address``/``server.port`` for
  a provider with a ``base_url``; the messages, in the conventions' parts form, only with
  ``capture_content``: see ``ringzero.core.support.genai``),
  ``execute_tool {name}`` for tools, ``exec {executor}`` for code runs, ``ringzero.{kind}``
  for memory, messages, spawn, sleep and the rest (a wait on a timer with its
  ``ringzero.timer.deadline``); time waiting in line at the LLM gate, 429s and retries are
  events on the ``chat`` span;
- a syscall served from the journal after a recovery makes no span of its own (the call was
  made, and traced, before the crash): it is an event ``ringzero.syscall.replayed`` on the
  process span;
- metrics: ``gen_ai.client.token.usage`` and ``gen_ai.client.operation.duration`` (the
  conventions' names), ``ringzero.llm.tokens`` and ``ringzero.llm.cost`` per process and
  model, ``ringzero.gate.wait``, ``ringzero.syscall.duration`` by kind, and
  ``ringzero.processes`` (live processes by status).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any

from ringzero.core.contract.outcomes import Failure, Outcome, Value, number
from ringzero.core.contract.records import CODE_RUNS
from ringzero.core.contract.types import JSON
from ringzero.core.support.genai import finish_reason, input_messages, output_messages, provider_name, server_of
from ringzero.core.support.no_telemetry import NoTelemetry, Traced

CAPTURE_CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
"""The GenAI instrumentations' switch for recording prompts and completions (off by default)."""

_SCOPE = "ringzero"
_SERVING: ContextVar[tuple[Telemetry, str] | None] = ContextVar("ringzero_telemetry_serving", default=None)
"""The telemetry and kind of the syscall being made live in this context (the gate, and the
host tools code calls from ``exec``, report to it)."""


def _providers(tracer_provider: Any, meter_provider: Any) -> tuple[Any, Any] | None:
    """The providers to use, or None where telemetry is off (no package, no SDK configured)."""
    try:
        from opentelemetry import metrics, trace
    except ImportError:
        return None
    if tracer_provider is None:
        found = trace.get_tracer_provider()
        tracer_provider = None if isinstance(found, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)) else found
    if meter_provider is None:
        found_meters = metrics.get_meter_provider()
        meter_provider = None if type(found_meters).__name__ in ("_ProxyMeterProvider", "NoOpMeterProvider") \
            else found_meters
    if tracer_provider is None and meter_provider is None:
        return None
    return tracer_provider, meter_provider


class Telemetry(NoTelemetry):
    """One kernel's tracer, meter and instruments (see the module's docstring)."""

    enabled = True

    def __init__(self, tracer_provider: Any, meter_provider: Any, *, capture_content: bool,
                 count_processes: Callable[[], Counter[str]]) -> None:
        from importlib.metadata import PackageNotFoundError, version

        from opentelemetry import trace

        try:
            release = version("ringzero")
        except PackageNotFoundError:  # pragma: no cover - a source checkout without metadata
            release = None
        self._trace = trace
        self.capture_content = capture_content
        self.tracer = tracer_provider.get_tracer(_SCOPE, release) if tracer_provider is not None else None
        self.meter = meter_provider.get_meter(_SCOPE, release) if meter_provider is not None else None
        if self.meter is not None:
            meter = self.meter
            self.token_usage = meter.create_histogram(
                "gen_ai.client.token.usage", unit="{token}", description="Tokens used per model call")
            self.operation_duration = meter.create_histogram(
                "gen_ai.client.operation.duration", unit="s", description="Model call duration, retries included")
            self.tokens = meter.create_counter(
                "ringzero.llm.tokens", unit="{token}", description="Tokens per process and model")
            self.cost = meter.create_counter("ringzero.llm.cost", unit="USD", description="Cost per process and model")
            self.gate_wait = meter.create_histogram(
                "ringzero.gate.wait", unit="s", description="Time a model call waited in line at the LLM gate")
            self.syscall_duration = meter.create_histogram(
                "ringzero.syscall.duration", unit="s", description="Syscalls made live, by kind")

            def observe(_options: Any) -> Iterator[Any]:
                from opentelemetry.metrics import Observation

                for status, count in count_processes().items():
                    yield Observation(count, {"ringzero.process.status": status})

            meter.create_observable_up_down_counter(
                "ringzero.processes", callbacks=[observe], unit="{process}",
                description="Live processes of this kernel by status")

    @classmethod
    def detect(cls, tracer_provider: Any, meter_provider: Any, capture_content: bool | None,
               count_processes: Callable[[], Counter[str]]) -> Telemetry | None:
        found = _providers(tracer_provider, meter_provider)
        if found is None:
            return None
        if capture_content is None:
            capture_content = os.environ.get(CAPTURE_CONTENT_ENV, "").strip().lower() in ("1", "true", "yes")
        return cls(*found, capture_content=capture_content, count_processes=count_processes)

    # ------------------------------------------------------------------ processes
    def process_started(self, process: Traced, parent: Any) -> Any:
        """Open the process's span (under ``parent``: its parent process's span, or the context
        the spawn was made in) and make it current in the process's task. Returns the span."""
        _SERVING.set(None)  # a child's task starts in a copy of its parent's spawn syscall's context
        if self.tracer is None:
            return None
        record = process.record
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": record.name,
            "gen_ai.provider.name": self._agent_provider(process),
            "gen_ai.agent.id": str(record.pid), "ringzero.process.pid": record.pid,
            "ringzero.process.name": record.name, "ringzero.process.priority": record.priority,
            "ringzero.process.program": record.program, "ringzero.process.recovered": process.recovered,
        }
        if record.parent is not None:
            attributes["ringzero.process.parent"] = record.parent
        span = self.tracer.start_span(f"invoke_agent {record.name}", context=parent, attributes=attributes)
        from opentelemetry import context

        context.attach(self._trace.set_span_in_context(span))  # this task's context only
        return span

    @staticmethod
    def _agent_provider(process: Traced) -> str:
        """The provider a process's model calls go to by default (``ringzero`` where it has none)."""
        gate = process.runtime.gates.get("default")
        return "ringzero" if gate is None else provider_name(gate.provider)

    def process_ended(self, span: Any, process: Traced) -> None:
        if span is None:
            return
        record = process.record
        span.set_attribute("ringzero.process.status", record.status.value)
        if record.stop_reason is not None:
            span.set_attribute("ringzero.process.stop_reason", record.stop_reason.value)
        reason = process.left_unfinished or process.fenced
        if reason is not None:
            span.set_attribute("ringzero.process.status", "unfinished")
            span.set_attribute("error.type", type(reason).__name__)
        if record.status.value == "failed" or (record.status.value == "killed" and record.error):
            error = record.error or {}
            span.set_attribute("error.type", error.get("type", record.status.value))
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, error.get("message", "")[:300]))
        span.end()

    def replayed(self, span: Any, kind: str, seq: int) -> None:
        if span is not None:
            span.add_event("ringzero.syscall.replayed", {"ringzero.syscall.kind": kind, "ringzero.syscall.seq": seq})

    # ------------------------------------------------------------------- syscalls
    def syscall_opened(self, process: Traced, kind: str, seq: int, summary: str,
                       about: Callable[[], Mapping[str, Any]] | None) -> Any:
        attributes = about() if about is not None else None
        span, entered = self.syscall_started(process, kind, seq, summary, attributes)
        return span, entered, time.monotonic(), attributes

    def syscall_closed(self, opened: Any, process: Traced, kind: str, outcome: Outcome | None,
                       raised: BaseException | None) -> None:
        span, entered, started, attributes = opened
        try:
            if raised is not None:
                self.syscall_raised(span, raised)
            elif outcome is not None:
                self.syscall_ended(span, process, kind, outcome, started, attributes)
        finally:
            self.leave(span, entered)

    def current_context(self) -> Any:
        """The OpenTelemetry context now (where a new process's span will go)."""
        from opentelemetry import context

        return context.get_current()

    def syscall_started(self, process: Traced, kind: str, seq: int, summary: str,
                        about: Mapping[str, Any] | None) -> tuple[Any, Any]:
        """Open a syscall's span under the current span (the process's, or one the program
        opened), or under the process's where the call came from elsewhere (a worker thread),
        and make it current for the call (the gate's events and an HTTP client's spans go under
        it). Returns the span and what ``leave`` needs."""
        from opentelemetry import context

        serving = _SERVING.set((self, kind))
        if self.tracer is None:
            return None, (serving, None)
        trace = self._trace
        parent = None
        if not trace.get_current_span().get_span_context().is_valid and process.span is not None:
            parent = trace.set_span_in_context(process.span)
        attributes: dict[str, Any] = {"ringzero.syscall.kind": kind, "ringzero.syscall.seq": seq,
                                      "ringzero.process.pid": process.pid}
        if summary and self.capture_content:  # a summary quotes the prompt, the code or the arguments
            attributes["ringzero.syscall.summary"] = summary
        if about:
            attributes.update(about)
        span_kind = trace.SpanKind.INTERNAL
        if kind == "llm":
            name, span_kind = f"chat {attributes.get('gen_ai.request.model') or ''}".rstrip(), trace.SpanKind.CLIENT
        elif kind == "tool":
            tool = str(attributes.setdefault("gen_ai.tool.name", summary))
            name = f"execute_tool {tool}"
            attributes["gen_ai.operation.name"] = "execute_tool"
        elif kind in CODE_RUNS:
            name = f"{kind} {attributes.get('ringzero.executor', '')}".rstrip()
        else:
            name = f"ringzero.{kind}"
        span = self.tracer.start_span(name, context=parent, kind=span_kind, attributes=attributes)
        return span, (serving, context.attach(trace.set_span_in_context(span)))

    def timer_set(self, opened: Any, deadline: float) -> None:
        """``ringzero.timer.deadline`` on a waiting syscall's span: when its timer fires (ISO 8601,
        UTC), the one journaled when it was first set."""
        span = opened[0]
        if span is not None:
            span.set_attribute("ringzero.timer.deadline", datetime.datetime.fromtimestamp(
                deadline, datetime.timezone.utc).isoformat())

    def syscall_raised(self, span: Any, exc: BaseException) -> None:
        """A syscall that ended in an exception rather than an outcome (a kill, a stop)."""
        if span is not None:
            span.set_attribute("error.type", type(exc).__name__)
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, str(exc)[:300]))

    def leave(self, span: Any, entered: tuple[Any, Any]) -> None:
        """End the syscall's span and restore the context it replaced."""
        serving, attached = entered
        _SERVING.reset(serving)
        if attached is not None:
            from opentelemetry import context

            context.detach(attached)
        if span is not None:
            span.end()

    def syscall_ended(self, span: Any, process: Traced, kind: str, outcome: Outcome,
                      started: float, about: Mapping[str, Any] | None) -> None:
        """Set what the outcome says on the syscall's span (still open) and record the metrics."""
        seconds = time.monotonic() - started
        error = outcome if isinstance(outcome, Failure) else None
        value = outcome.value if isinstance(outcome, Value) else None
        if span is not None:
            if error is not None:
                span.set_attribute("error.type", error.type)
                span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, error.message[:300]))
            if kind == "llm" and isinstance(value, Mapping):
                self._llm_attributes(span, value)
            elif kind in CODE_RUNS and isinstance(value, Mapping):
                failed = value.get("error")
                if isinstance(failed, Mapping):  # the code raised: the run itself went fine
                    span.set_attribute("error.type", str(failed.get("type")))
                if isinstance(value.get("duration"), (int, float)):
                    span.set_attribute("ringzero.exec.duration", number(value.get("duration")))
        if self.meter is None:
            return
        self.syscall_duration.record(seconds, {"ringzero.syscall.kind": kind,
                                               **({"error.type": error.type} if error is not None else {})})
        if kind == "llm":
            self._llm_metrics(process, value, seconds, about or {}, error)

    def _llm_attributes(self, span: Any, value: Mapping[str, JSON]) -> None:
        usage = value.get("usage") or {}
        if isinstance(usage, Mapping):
            span.set_attribute("gen_ai.usage.input_tokens", int(number(usage.get("input_tokens"))))
            span.set_attribute("gen_ai.usage.output_tokens", int(number(usage.get("output_tokens"))))
            if usage.get("cost") is not None:
                span.set_attribute("ringzero.llm.cost", number(usage.get("cost")))
        if value.get("model"):
            span.set_attribute("gen_ai.response.model", str(value["model"]))
        if value.get("id"):
            span.set_attribute("gen_ai.response.id", str(value["id"]))
        span.set_attribute("gen_ai.response.finish_reasons", [finish_reason(value.get("stop_reason"))])
        message = value.get("message")
        if self.capture_content and isinstance(message, Mapping):
            span.set_attribute("gen_ai.output.messages", json.dumps(output_messages(message, value.get("stop_reason"))))

    def _llm_metrics(self, process: Traced, value: JSON, seconds: float, about: Mapping[str, Any],
                     error: Failure | None) -> None:
        common = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": about.get("gen_ai.provider.name", ""),
                  "gen_ai.request.model": about.get("gen_ai.request.model") or ""}
        self.operation_duration.record(seconds, {**common, **({"error.type": error.type} if error is not None else {})})
        usage = value.get("usage") if isinstance(value, Mapping) else None
        if not isinstance(usage, Mapping):
            return
        mine = {"ringzero.process.pid": process.pid, "ringzero.process.name": process.record.name,
                "gen_ai.request.model": common["gen_ai.request.model"]}
        for token_type, key in (("input", "input_tokens"), ("output", "output_tokens")):
            count = int(number(usage.get(key)))
            self.token_usage.record(count, {**common, "gen_ai.token.type": token_type})
            self.tokens.add(count, {**mine, "gen_ai.token.type": token_type})
        if usage.get("cost") is not None:
            self.cost.add(number(usage.get("cost")), mine)

    def llm_about(self, gate: Any, name: str, request: Any) -> dict[str, Any]:
        """The ``chat`` span's request attributes (made only where telemetry is on): ``gate`` is
        the LLM gate the call goes through (None where the kernel has no provider ``name``)."""
        provider = getattr(gate, "provider", None)
        about: dict[str, Any] = {"gen_ai.operation.name": "chat",
                                 "gen_ai.provider.name": name if provider is None else provider_name(provider),
                                 "gen_ai.request.model": request.model or getattr(provider, "model", None) or "",
                                 **server_of(provider)}
        if request.max_tokens is not None:
            about["gen_ai.request.max_tokens"] = request.max_tokens
        if request.temperature is not None:
            about["gen_ai.request.temperature"] = request.temperature
        if self.capture_content:
            about["gen_ai.input.messages"] = json.dumps(input_messages(m.to_dict() for m in request.messages))
        return about


def gate_waited(seconds: float, priority: int) -> None:
    """The LLM gate held a call in line for ``seconds``: an event on its ``chat`` span and the
    ``ringzero.gate.wait`` histogram, where the call is a kernel syscall with telemetry on."""
    serving = _SERVING.get()
    if serving is None:
        return
    telemetry = serving[0]
    if telemetry.meter is not None:
        telemetry.gate_wait.record(seconds, {"ringzero.process.priority": priority})
    if telemetry.tracer is not None:
        span = telemetry._trace.get_current_span()
        span.add_event("ringzero.gate.wait", {"ringzero.gate.wait_seconds": seconds,
                                              "ringzero.process.priority": priority})


def gate_failed(error: Exception, attempt: int, retry_in: float | None) -> None:
    """An attempt at a model call failed: a ``ringzero.llm.rate_limited`` event for a 429, else
    ``ringzero.llm.retry`` (``retry_in`` None: not retried, the call ends with this error)."""
    serving = _SERVING.get()
    if serving is None or serving[0].tracer is None:
        return
    telemetry = serving[0]
    attributes: dict[str, Any] = {"error.type": type(error).__name__, "ringzero.llm.attempt": attempt + 1,
                                  "ringzero.llm.retried": retry_in is not None}
    if retry_in is not None:
        attributes["ringzero.llm.retry_in"] = retry_in
    status = getattr(error, "status", None)
    if isinstance(status, int):
        attributes["http.response.status_code"] = status
    name = "ringzero.llm.rate_limited" if type(error).__name__ == "RateLimited" else "ringzero.llm.retry"
    telemetry._trace.get_current_span().add_event(name, attributes)


def exec_tool_span(tool: Any, name: str | None = None) -> Any:
    """A span for a host tool that code run by ``ctx.exec`` calls (``execute_tool {name}``, under
    the ``exec`` span), as a context manager; None outside a traced exec (``ctx.tool`` has its
    own syscall span). ``name`` is what the code calls it (``tools={"t": lambda ...}`` is ``t``);
    without it, the function's own name."""
    serving = _SERVING.get()
    if serving is None or serving[1] not in CODE_RUNS or serving[0].tracer is None:
        return None
    name = name or getattr(tool, "__name__", None) or getattr(getattr(tool, "func", None), "__name__", None) \
        or type(tool).__name__
    return serving[0].tracer.start_as_current_span(
        f"execute_tool {name}", attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name})


@contextlib.contextmanager
def egress_span(method: str, scheme: str, host: str, port: int, path: str) -> Iterator[Any]:
    """A client span for one request a run sends through the host's egress (OpenTelemetry's HTTP
    conventions: ``{method}``, ``http.request.method``, ``server.address``, ``server.port``,
    ``url.scheme``, ``url.path``), under the ``execute_tool http_request`` span; yields the
    span, or None outside a traced kernel syscall."""
    serving = _SERVING.get()
    if serving is None or serving[0].tracer is None:
        yield None
        return
    attributes = {"http.request.method": method, "server.address": host, "server.port": port, "url.scheme": scheme,
                  "url.path": path.partition("?")[0]}
    with serving[0].tracer.start_as_current_span(method, kind=serving[0]._trace.SpanKind.CLIENT,
                                                 attributes=attributes) as span:
        yield span
