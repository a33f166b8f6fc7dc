"""OpenTelemetry: the spans and metrics a kernel makes, read back with the SDK's in-memory
exporter and reader, as an application that configured the SDK would get them."""

from __future__ import annotations

import asyncio
import datetime
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ringzero import Context, Egress, ExecLimits, Kernel, ProcessFailed, ProcessStatus
from ringzero.checkpointers import MemoryCheckpointer, SqliteCheckpointer
from ringzero.core.contract.types import LLMResponse, Message, Usage
from ringzero.testing import ScriptedProvider
from tests.egress_servers import local_ca, serving


class Telemetry:
    """An SDK tracer provider and meter provider whose output the test reads."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def kernel(self, **kwargs: Any) -> Kernel:
        return Kernel(tracer_provider=self.tracer_provider, meter_provider=self.meter_provider, **kwargs)

    @property
    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, prefix: str) -> list[ReadableSpan]:
        return [s for s in self.spans if s.name.startswith(prefix)]

    def metrics(self) -> dict[str, list[Any]]:
        data = self.reader.get_metrics_data()
        out: dict[str, list[Any]] = {}
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    out.setdefault(metric.name, []).extend(metric.data.data_points)
        return out


@pytest.fixture
def otel(monkeypatch: pytest.MonkeyPatch) -> Iterator[Telemetry]:
    # conftest turns the SDK off for CrewAI's own telemetry; these providers are the test's.
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    telemetry = Telemetry()
    yield telemetry
    telemetry.tracer_provider.shutdown()
    telemetry.meter_provider.shutdown()


def answer(request: Any) -> LLMResponse:
    return LLMResponse(Message("assistant", f"answer to {request.messages[-1].content}"),
                       Usage(input_tokens=11, output_tokens=7, cost=0.002), model="scripted-1")


def double(x: int) -> int:
    return x * 2


async def child(ctx: Context) -> str:
    await ctx.sleep(3600)
    return "never"


async def parent(ctx: Context) -> None:
    await ctx.llm("hello", model="scripted-1")
    result = await ctx.exec("double(21)", tools={"double": double})
    assert result.value == 42, result
    await ctx.spawn(child)
    await ctx.sleep(3600)  # killed here


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


async def test_the_span_tree_of_a_process_that_is_killed(otel: Telemetry) -> None:
    async with otel.kernel(llm=ScriptedProvider(answer), checkpointer=MemoryCheckpointer()) as kernel:
        process = await kernel.spawn(parent, name="planner", priority=3)
        while len(await kernel.ps()) < 2 or any(p.status is not ProcessStatus.WAITING for p in await kernel.ps()):
            await asyncio.sleep(0.01)
        await process.kill()
        with pytest.raises(ProcessFailed):
            await process.wait()
    [root] = otel.named("invoke_agent planner")
    assert root.parent is None and root.kind is trace.SpanKind.INTERNAL
    attrs = root.attributes or {}
    assert attrs["gen_ai.operation.name"] == "invoke_agent" and attrs["gen_ai.agent.name"] == "planner"
    assert attrs["gen_ai.provider.name"] == "ringzero.scripted"  # required on an agent span
    assert attrs["ringzero.process.pid"] == process.pid and attrs["ringzero.process.priority"] == 3
    assert attrs["ringzero.process.status"] == "killed" and attrs["ringzero.process.stop_reason"] == "killed"

    [chat] = otel.named("chat")
    assert chat.name == "chat scripted-1" and chat.kind is trace.SpanKind.CLIENT
    assert parent_of(chat) == root.context.span_id
    c = chat.attributes or {}
    assert c["gen_ai.operation.name"] == "chat" and c["gen_ai.provider.name"] == "ringzero.scripted"
    assert c["gen_ai.request.model"] == "scripted-1" and c["gen_ai.response.model"] == "scripted-1"
    assert c["gen_ai.usage.input_tokens"] == 11 and c["gen_ai.usage.output_tokens"] == 7
    assert tuple(c["gen_ai.response.finish_reasons"]) == ("stop",)  # type: ignore[arg-type]  # the conventions' name
    assert "gen_ai.input.messages" not in c and "gen_ai.output.messages" not in c, "content only when asked"

    [run] = otel.named("exec ")
    assert run.name == "exec MontyExecutor" and parent_of(run) == root.context.span_id
    assert (run.attributes or {})["ringzero.isolation"] == "interpreter"
    [tool] = otel.named("execute_tool")
    assert tool.name == "execute_tool double" and parent_of(tool) == run.context.span_id
    assert (tool.attributes or {})["gen_ai.tool.name"] == "double"

    [spawn] = otel.named("ringzero.spawn")
    assert parent_of(spawn) == root.context.span_id
    [kid] = otel.named("invoke_agent child")
    assert parent_of(kid) == spawn.context.span_id, "a child's span goes under the spawn that made it"
    assert (kid.attributes or {})["ringzero.process.parent"] == process.pid
    assert (kid.attributes or {})["ringzero.process.status"] == "killed"  # a killed parent's children go too

    sleeps = otel.named("ringzero.sleep")
    assert {parent_of(s) for s in sleeps} == {root.context.span_id, kid.context.span_id}
    killed_sleep = next(s for s in sleeps if parent_of(s) == root.context.span_id)
    assert (killed_sleep.attributes or {})["error.type"] == "CancelledError"
    deadline = datetime.datetime.fromisoformat(str((killed_sleep.attributes or {})["ringzero.timer.deadline"]))
    assert 3590 < (deadline - datetime.datetime.now(datetime.timezone.utc)).total_seconds() <= 3600


async def test_llm_metrics_per_process_and_model(otel: Telemetry) -> None:
    async def asks(ctx: Context, n: int) -> None:
        for i in range(n):
            await ctx.llm(f"q{i}", model="scripted-1")

    async with otel.kernel(llm=ScriptedProvider(answer), checkpointer=MemoryCheckpointer()) as kernel:
        a = await kernel.spawn(asks, 2, name="a")
        b = await kernel.spawn(asks, 3, name="b")
        await a.wait()
        await b.wait()
        metrics = otel.metrics()
    tokens = {(p.attributes["ringzero.process.name"], p.attributes["gen_ai.token.type"]): p.value
              for p in metrics["ringzero.llm.tokens"]}
    assert tokens == {("a", "input"): 22, ("a", "output"): 14, ("b", "input"): 33, ("b", "output"): 21}
    cost = {p.attributes["ringzero.process.name"]: round(p.value, 6) for p in metrics["ringzero.llm.cost"]}
    assert cost == {"a": 0.004, "b": 0.006}
    usage = {p.attributes["gen_ai.token.type"]: (p.count, p.sum) for p in metrics["gen_ai.client.token.usage"]}
    assert usage == {"input": (5, 55), "output": (5, 35)}
    [duration] = metrics["gen_ai.client.operation.duration"]
    assert duration.count == 5 and duration.attributes["gen_ai.request.model"] == "scripted-1"
    kinds = {p.attributes["ringzero.syscall.kind"]: p.count for p in metrics["ringzero.syscall.duration"]}
    assert kinds == {"llm": 5}


async def test_live_processes_by_status_are_observed(otel: Telemetry) -> None:
    async with otel.kernel(checkpointer=MemoryCheckpointer()) as kernel:
        sleepers = [await kernel.spawn(child) for _ in range(3)]
        while any(p.status is not ProcessStatus.WAITING for p in sleepers):
            await asyncio.sleep(0.01)
        observed = {p.attributes["ringzero.process.status"]: p.value for p in otel.metrics()["ringzero.processes"]}
        assert observed == {"waiting": 3}
        for p in sleepers:
            await p.kill()


async def test_content_is_recorded_only_when_asked(otel: Telemetry) -> None:
    async def one(ctx: Context) -> None:
        await ctx.llm("the secret plan")

    async with otel.kernel(llm=ScriptedProvider(answer), checkpointer=MemoryCheckpointer(),
                           capture_content=True) as kernel:
        await (await kernel.spawn(one)).wait()
    [chat] = otel.named("chat")
    attrs = chat.attributes or {}
    assert "the secret plan" in str(attrs["gen_ai.input.messages"])
    assert "answer to the secret plan" in str(attrs["gen_ai.output.messages"])


async def test_spans_a_program_opens_nest_under_its_process(otel: Telemetry) -> None:
    tracer = otel.tracer_provider.get_tracer("my-graph")

    async def graph(ctx: Context) -> None:
        with tracer.start_as_current_span("node plan"):
            await ctx.llm("plan")
        await asyncio.gather(*(asyncio.to_thread(lambda: tracer.start_span("in a thread").end()) for _ in range(1)))

    async with otel.kernel(llm=ScriptedProvider(answer), checkpointer=MemoryCheckpointer()) as kernel:
        await (await kernel.spawn(graph)).wait()
    [root] = otel.named("invoke_agent")
    [node] = otel.named("node plan")
    [chat] = otel.named("chat")
    assert parent_of(node) == root.context.span_id and parent_of(chat) == node.context.span_id
    [threaded] = otel.named("in a thread")
    assert parent_of(threaded) == root.context.span_id, "the process's context reaches its worker threads"


async def test_without_a_configured_provider_telemetry_is_off() -> None:
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider), "no test sets the global provider"
    async with Kernel(checkpointer=MemoryCheckpointer()) as kernel:
        assert kernel.telemetry is None


@pytest.mark.timeout(120)
async def test_after_kill_9_and_recover_a_replayed_llm_call_makes_no_second_span(
    otel: Telemetry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.programs import logging_llm, record_tool
    from tests.test_durable import crash_host_midrun

    log = tmp_path / "calls.log"
    log.touch()
    monkeypatch.setenv("RINGZERO_TEST_LOG", str(log))
    db = tmp_path / "state.db"
    pid = await asyncio.to_thread(crash_host_midrun, db, 12, log)

    def asked() -> int:
        return sum(line.startswith("llm") for line in log.read_text().splitlines())

    asked_before = asked()
    async with otel.kernel(checkpointer=SqliteCheckpointer(db), llm=ScriptedProvider(logging_llm),
                           tools={"record": record_tool}) as kernel:
        journal = await kernel.store.journal(pid)
        replayed_llm = sum(e.kind == "llm" for e in journal)
        assert replayed_llm >= 4
        [handle] = await kernel.recover()
        await handle.wait(timeout=30)
    [root] = otel.named("invoke_agent worker")
    assert (root.attributes or {})["ringzero.process.recovered"] is True
    replays = [e for e in root.events if e.name == "ringzero.syscall.replayed"]
    assert [e.attributes["ringzero.syscall.kind"] for e in replays] == [e.kind for e in journal]  # type: ignore[index]
    chats = otel.named("chat")
    assert len(chats) == 12 - replayed_llm == asked() - asked_before, \
        "a chat span for each call made live after the recovery, none for a replayed one"


class _Receiver(BaseHTTPRequestHandler):
    """An OTLP/HTTP collector's front door: keeps every body POSTed to /v1/traces."""

    bodies: list[bytes] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path == "/v1/traces" and self.headers["Content-Type"] == "application/x-protobuf":
            type(self).bodies.append(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


async def test_spans_exported_over_otlp_http_reach_a_receiver(monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    _Receiver.bodies = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        provider = TracerProvider(resource=Resource.create({"service.name": "agents"}))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(
            endpoint=f"http://127.0.0.1:{server.server_address[1]}/v1/traces")))

        async def one(ctx: Context) -> str:
            return (await ctx.llm("hi", model="scripted-1")).content

        async with Kernel(checkpointer=MemoryCheckpointer(), llm=ScriptedProvider(answer),
                          tracer_provider=provider) as kernel:
            await (await kernel.spawn(one, name="greeter")).wait()
        assert await asyncio.to_thread(provider.force_flush, 10_000)
        provider.shutdown()
    finally:
        server.shutdown()
        server.server_close()
    spans = {}
    for body in _Receiver.bodies:
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}["service.name"]
            for scope_spans in resource_spans.scope_spans:
                assert scope_spans.scope.name == "ringzero"
                for span in scope_spans.spans:
                    spans[span.name] = ({a.key: a.value for a in span.attributes}, span, service)
    assert set(spans) == {"invoke_agent greeter", "chat scripted-1"}
    chat_attrs, chat, service = spans["chat scripted-1"]
    root = spans["invoke_agent greeter"][1]
    assert service == "agents" and chat.parent_span_id == root.span_id and chat.trace_id == root.trace_id
    assert chat_attrs["gen_ai.usage.input_tokens"].int_value == 11
    assert chat_attrs["gen_ai.provider.name"].string_value == "ringzero.scripted"


def test_the_operators_page_lines_send_a_kernel_s_spans_to_a_collector(tmp_path: Path) -> None:
    """The three lines of docs/operators.md, in a fresh interpreter (the global provider is set once per
    process), against a receiver this test starts on 127.0.0.1."""
    import re
    import subprocess
    import sys

    readme = (Path(__file__).parent.parent / "docs/operators.md").read_text()
    block = re.search(r"```python\n(from opentelemetry import trace\n.*?)```", readme, re.S)
    assert block is not None
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    _Receiver.bodies = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    script = block.group(1).replace("127.0.0.1:4318", f"127.0.0.1:{server.server_address[1]}") + (
        "import asyncio\n"
        "from ringzero import Kernel\n"
        "from ringzero.checkpointers import MemoryCheckpointer\n"
        "from ringzero.testing import ScriptedProvider\n"
        "from tests.test_telemetry import answer\n"
        "async def agent(ctx):\n"
        "    return (await ctx.llm('hi', model='scripted-1')).content\n"
        "async def main():\n"
        "    async with Kernel(checkpointer=MemoryCheckpointer(), llm=ScriptedProvider(answer)) as kernel:\n"
        "        await (await kernel.spawn(agent, name='readme')).wait()\n"
        "asyncio.run(main())\n"
        "provider.shutdown()\n")
    try:
        env = {k: v for k, v in os.environ.items() if k != "OTEL_SDK_DISABLED"}
        done = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).parent.parent, env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
    finally:
        server.shutdown()
        server.server_close()
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    names = {span.name for body in _Receiver.bodies
             for rs in ExportTraceServiceRequest.FromString(body).resource_spans
             for ss in rs.scope_spans for span in ss.spans}
    assert names == {"invoke_agent readme", "chat scripted-1"}


async def test_a_429_its_retry_and_time_in_line_at_the_gate_are_events_on_the_chat_span(otel: Telemetry) -> None:
    from ringzero import LLMGate, RateLimit, RetryPolicy
    from ringzero.core.contract.errors import RateLimited

    refused: list[str] = []

    def once_refused(request: Any) -> LLMResponse:
        prompt = request.messages[-1].content
        if prompt == "first" and not refused:
            refused.append(prompt)
            raise RateLimited("429 from the test", retry_after=0.01)
        return answer(request)

    async def ask(ctx: Context, prompt: str) -> None:
        await ctx.llm(prompt)

    gate = LLMGate(ScriptedProvider(once_refused, latency=0.05), RateLimit(max_concurrency=1),
                   RetryPolicy(base_delay=0.01))
    async with otel.kernel(llm=gate, checkpointer=MemoryCheckpointer()) as kernel:
        first = await kernel.spawn(ask, "first", name="first")
        second = await kernel.spawn(ask, "second", name="second")
        await first.wait()
        await second.wait()
    events = {span.attributes["ringzero.process.pid"]: [e.name for e in span.events]  # type: ignore[index]
              for span in otel.named("chat")}
    assert events[first.pid][0] == "ringzero.llm.rate_limited"
    limited = next(e for s in otel.named("chat") for e in s.events if e.name == "ringzero.llm.rate_limited")
    attributes = dict(limited.attributes or {})
    assert attributes.pop("ringzero.llm.retry_in") >= 0.01  # type: ignore[operator]  # Retry-After, plus jitter
    assert attributes == {"error.type": "RateLimited", "ringzero.llm.attempt": 1, "ringzero.llm.retried": True}
    assert "ringzero.gate.wait" in events[first.pid] + events[second.pid], "one of them waited for the other's slot"
    [wait] = [p for p in otel.metrics()["ringzero.gate.wait"]]
    assert wait.count >= 1 and wait.sum > 0


async def test_a_tool_span_is_named_by_the_tool_and_no_span_quotes_a_call_unless_asked(otel: Telemetry) -> None:
    async def one_call_each(ctx: Context) -> None:
        await ctx.llm("the secret plan")
        await ctx.tool(double, 21)

    async with otel.kernel(llm=ScriptedProvider(answer), checkpointer=MemoryCheckpointer()) as kernel:
        await (await kernel.spawn(one_call_each)).wait()
    [tool] = otel.named("execute_tool")
    assert tool.name == "execute_tool double" and (tool.attributes or {})["gen_ai.tool.name"] == "double"
    spans = otel.named("")
    assert spans and not any("secret" in str(span.attributes) or "21" in str(dict(span.attributes or {}).get(
        "ringzero.syscall.summary", "")) for span in spans), "the prompt and the arguments stay out of the spans"


async def test_a_tool_that_code_calls_is_named_by_the_name_the_code_calls_it(otel: Telemetry) -> None:
    """``tools={"t": lambda ...}``: the span is ``execute_tool t``, not ``execute_tool <lambda>``."""
    async def calls_a_lambda(ctx: Context) -> object:
        return (await ctx.exec("t(20) + 1", tools={"t": lambda x: x * 2})).value

    async with otel.kernel(llm=ScriptedProvider(answer), checkpointer=MemoryCheckpointer()) as kernel:
        assert await (await kernel.spawn(calls_a_lambda)).wait() == 41
    [tool] = otel.named("execute_tool")
    assert tool.name == "execute_tool t" and (tool.attributes or {})["gen_ai.tool.name"] == "t"


async def test_finish_reasons_are_the_conventions_names(otel: Telemetry) -> None:
    """A reply that asks for a tool finishes with ``tool_call``, one that ends with ``stop``: the
    GenAI conventions' values, not the provider's (``tool_use``, ``end_turn``)."""
    from ringzero.core.contract.types import Message, ToolCall

    replies = [Message("assistant", "", tool_calls=(ToolCall("c1", "lookup", {"q": "x"}),)), "done"]

    async def asks_twice(ctx: Context) -> None:
        await ctx.llm("first")
        await ctx.llm("second")

    async with otel.kernel(llm=ScriptedProvider(replies), checkpointer=MemoryCheckpointer()) as kernel:
        await (await kernel.spawn(asks_twice)).wait()
    reasons = [tuple((span.attributes or {})["gen_ai.response.finish_reasons"]) for span in otel.named("chat")]
    assert sorted(reasons) == [("stop",), ("tool_call",)], reasons


async def test_a_vendor_call_s_span_has_the_conventions_parts_response_id_and_server(otel: Telemetry) -> None:
    """Against an OpenAI-compatible server: the messages in the parts form (text, tool_call,
    tool_call_response; the output with its finish_reason), the response's id, the server's
    address and port, and the provider's name on the agent span too."""
    import json

    from ringzero.compat.vendor_servers import openai_answer, vendor_server
    from ringzero.core.contract.types import ToolCall
    from ringzero.providers.llm import OpenAIProvider

    history = [Message("system", "Be brief."), Message("user", "Weather in Paris?"),
               Message("assistant", "", tool_calls=(ToolCall("call_1", "weather", {"city": "Paris"}),)),
               Message("tool", "sunny", tool_call_id="call_1", name="weather")]

    async def asks(ctx: Context) -> None:
        await ctx.llm(history)

    with vendor_server("openai", [openai_answer("It is sunny.")]) as server:
        provider = OpenAIProvider("gpt-test", base_url=server.url, api_key="sk-test")
        async with otel.kernel(llm=provider, checkpointer=MemoryCheckpointer(), capture_content=True) as kernel:
            await (await kernel.spawn(asks, name="weather")).wait()
        port = int(server.url.rsplit(":", 1)[1].split("/")[0])
    [agent] = otel.named("invoke_agent weather")
    assert (agent.attributes or {})["gen_ai.provider.name"] == "openai"
    [chat] = otel.named("chat")
    attrs = chat.attributes or {}
    assert attrs["gen_ai.response.id"] == "chatcmpl-1"
    assert (attrs["server.address"], attrs["server.port"]) == ("127.0.0.1", port)
    assert json.loads(str(attrs["gen_ai.input.messages"])) == [
        {"role": "system", "parts": [{"type": "text", "content": "Be brief."}]},
        {"role": "user", "parts": [{"type": "text", "content": "Weather in Paris?"}]},
        {"role": "assistant", "parts": [{"type": "tool_call", "id": "call_1", "name": "weather",
                                         "arguments": {"city": "Paris"}}]},
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "call_1", "response": "sunny"}],
         "name": "weather"}]
    assert json.loads(str(attrs["gen_ai.output.messages"])) == [
        {"role": "assistant", "parts": [{"type": "text", "content": "It is sunny."}], "finish_reason": "stop"}]


async def test_a_kernel_without_a_model_names_ringzero_as_its_agents_provider(otel: Telemetry) -> None:
    async def idle(ctx: Context) -> int:
        return 1

    async with otel.kernel(checkpointer=MemoryCheckpointer()) as kernel:
        await (await kernel.spawn(idle, name="plain")).wait()
    [agent] = otel.named("invoke_agent plain")
    assert (agent.attributes or {})["gen_ai.provider.name"] == "ringzero"


async def requests_an_api(ctx: Context, port: int, trust: str) -> int:
    egress = Egress(allow=[f"api.test:{port}"], addresses=["127.0.0.1"], trust=trust,
                    resolver=lambda host: ["127.0.0.1"])
    out = await ctx.exec(f"http_request('GET', 'https://api.test:{port}/echo?q=1')['status']",
                         limits=ExecLimits(egress=egress))
    return int(out.value)  # type: ignore[arg-type]


async def test_a_request_through_the_hosts_egress_is_an_http_client_span_under_its_tool(
        otel: Telemetry, tmp_path: Path) -> None:
    ca = local_ca(tmp_path)
    with serving(ca) as api:
        async with otel.kernel(checkpointer=MemoryCheckpointer()) as kernel:
            assert await (await kernel.spawn(requests_an_api, api.port, str(ca.pem))).wait() == 200
    [tool] = otel.named("execute_tool")
    [request] = otel.named("GET")
    assert tool.name == "execute_tool http_request" and parent_of(request) == tool.context.span_id
    assert request.kind.name == "CLIENT"
    assert dict(request.attributes or {}) == {
        "http.request.method": "GET", "server.address": "api.test", "server.port": api.port, "url.scheme": "https",
        "url.path": "/echo", "http.response.status_code": 200}
