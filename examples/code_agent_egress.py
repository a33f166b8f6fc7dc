"""A code agent calls an API with a key it never holds.

The model writes Python that calls ``http_request`` (the agent's egress tool); the host checks
each request against the agent's ``Egress`` policy, resolves the name itself, and puts the real
key in where the code wrote its placeholder, only on HTTPS to the host the key is bound to.
The key never enters the sandbox, the journal or the model's context.

Runs offline: the API is a local stand-in on 127.0.0.1 (HTTPS, with a certificate from a
throwaway CA), the model a scripted one that reads the allowed URL from its prompt.

    python examples/code_agent_egress.py
"""

from __future__ import annotations

import http.server
import re
import tempfile
import threading
from pathlib import Path

from ringzero import Egress, Secret
from ringzero.agents.code_agent import CodeAgent
from ringzero.core.contract.types import LLMRequest
from ringzero.providers.egress.certificates import RunAuthority
from ringzero.testing import ScriptedProvider

WEATHER_KEY = "wk-live-0c8f2a9d41e7"  # in a real deployment: from your secret store, on the host only
SEEN: list[str] = []


class WeatherAPI(http.server.BaseHTTPRequestHandler):
    """The stand-in API: answers a forecast to a request with the right key, 401 otherwise."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        SEEN.append(self.headers.get("Authorization", ""))
        ok = self.headers.get("Authorization") == f"Bearer {WEATHER_KEY}"
        body = b"Oslo: 4 C, light rain" if ok else b"unauthorized"
        self.send_response(200 if ok else 401)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def scripted_model(request: LLMRequest) -> str:
    """Writes the code a model would: the URL from the prompt's allowed list, the placeholder
    where the key goes."""
    route = re.search(r"https://api\.weather\.test:\d+", request.messages[0].content)
    assert route is not None, "the prompt names the allowed API"
    return ("```python\n"
            f"r = http_request('GET', '{route.group(0)}/v1/forecast?city=Oslo',\n"
            "                 headers={'Authorization': 'Bearer rz-secret-WEATHER_KEY'})\n"
            "final_answer(r['text'] if r['status'] == 200 else 'the API said ' + str(r['status']))\n"
            "```")


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="ringzero-example-") as folder:
        ask_the_weather(Path(folder))


def ask_the_weather(folder: Path) -> None:
    authority = RunAuthority()  # a throwaway CA for the stand-in's certificate
    (folder / "ca.pem").write_text(authority.pem)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), WeatherAPI)
    server.socket = authority.server_context("api.weather.test").wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]

    egress = Egress(
        allow=[f"api.weather.test:{port}"],
        secrets={"WEATHER_KEY": Secret(WEATHER_KEY, hosts=["api.weather.test"])},
        trust=str(folder / "ca.pem"),
        resolver=lambda host: ["127.0.0.1"],  # the stand-in's name; a real API needs neither this
        addresses=["127.0.0.1"],              # nor loopback allowed
    )
    with CodeAgent(llm=ScriptedProvider(scripted_model), egress=egress, state_dir=folder / "state") as agent:
        answer, _output, error = agent.execute_task("What is the weather in Oslo?")
    server.shutdown()
    print(f"answer: {answer}")
    print(f"error: {error}")
    expected = f"Bearer {WEATHER_KEY}"
    print(f"the API received the real key: {SEEN.count(expected) == len(SEEN) == 1}")
    journal = b"".join(p.read_bytes() for p in (folder / "state").glob("agent.db*"))
    print(f"the request is in the agent's journal: {b'http_request(' in journal}; "
          f"the key is: {WEATHER_KEY.encode() in journal}")


if __name__ == "__main__":
    main()
