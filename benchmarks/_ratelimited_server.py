"""A tiny OpenAI-style chat server on 127.0.0.1 that answers 429 past a rate limit.

Run as ``python benchmarks/_ratelimited_server.py RATE BURST``; it prints its port, then
serves ``POST /v1/chat/completions`` (HTTP/1.1 keep-alive) until it is terminated. Its
limit is a token bucket of RATE requests/second holding BURST; a refused request gets a
429 with ``Retry-After`` (seconds, fractional) saying when the next one would pass.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time


class Bucket:
    def __init__(self, rate: float, burst: float) -> None:
        self.rate, self.capacity, self.level, self.stamp = rate, burst, burst, time.monotonic()
        self.accepted = self.refused = 0

    def take(self) -> float:
        """0.0 when the request may pass, else the seconds until it would."""
        now = time.monotonic()
        self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.level >= 1.0:
            self.level -= 1.0
            self.accepted += 1
            return 0.0
        self.refused += 1
        return (1.0 - self.level) / self.rate


def response(status: str, body: dict[str, object], extra: str = "") -> bytes:
    data = json.dumps(body).encode()
    head = f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n{extra}\r\n"
    return head.encode() + data


async def serve(bucket: Bucket, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            body = json.loads(await reader.readexactly(length)) if length else {}
            if head.startswith(b"GET /stats"):
                writer.write(response("200 OK", {"accepted": bucket.accepted, "refused": bucket.refused}))
            elif (wait := bucket.take()) > 0:
                error = {"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}}
                writer.write(response("429 Too Many Requests", error, f"Retry-After: {wait:.4f}\r\n"))
            else:
                prompt = body.get("messages", [{}])[-1].get("content", "")
                writer.write(response("200 OK", {
                    "id": "cmpl", "object": "chat.completion", "model": body.get("model", "bench"),
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": f"echo: {prompt}"}}],
                    "usage": {"prompt_tokens": len(prompt.split()), "completion_tokens": 2},
                }))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def main(rate: float, burst: float) -> None:
    bucket = Bucket(rate, burst)
    server = await asyncio.start_server(lambda r, w: serve(bucket, r, w), "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(float(sys.argv[1]), float(sys.argv[2])))
