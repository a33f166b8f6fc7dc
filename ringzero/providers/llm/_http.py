"""What the HTTP LLM providers share: one JSON POST, one streamed POST (server-sent events),
and the vendors' failures as typed errors.

Both vendors answer an error with a status code and a JSON body; the status decides the
kernel's error (429 is RateLimited with its Retry-After, 5xx and 529 are ProviderUnavailable,
401/403 AuthenticationFailed), and the body's code or message picks out a context overflow,
which both vendors send as a plain 400.
"""

from __future__ import annotations

import email.utils
import json
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx

from ringzero.core.contract import errors

__all__ = ["error_of_exception", "event_json", "post_events", "post_json", "provider_error", "retry_after_seconds"]

_CONTEXT_OVERFLOW = ("context_length_exceeded", "maximum context length", "context window",
                     "prompt is too long", "too many tokens", "reduce the length")


def retry_after_seconds(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait from ``retry-after-ms``, ``retry-after`` (seconds or an HTTP date), or None."""
    lowered = {k.lower(): v for k, v in headers.items()}
    if "retry-after-ms" in lowered:
        try:
            return max(0.0, float(lowered["retry-after-ms"]) / 1000)
        except ValueError:
            pass
    value = lowered.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        when = email.utils.parsedate_to_datetime(value) if value else None
        return None if when is None else max(0.0, when.timestamp() - time.time())


def provider_error(status: int, headers: Mapping[str, str], body: str, vendor: str) -> errors.ProviderError:
    """The kernel's typed error for a vendor's HTTP failure."""
    detail = _error_detail(body)
    message = f"{vendor} answered HTTP {status}: {detail}"
    lowered = detail.lower()
    if status == 429:
        return errors.RateLimited(message, retry_after_seconds(headers))
    if status in (401, 403):
        return errors.AuthenticationFailed(message)
    if status == 413 or (status in (400, 422) and any(marker in lowered for marker in _CONTEXT_OVERFLOW)):
        return errors.ContextTooLong(message)
    if status in (408, 409) or status >= 500:  # 529 is Anthropic's "overloaded"
        return errors.ProviderUnavailable(message)
    return errors.BadRequest(message)


def _error_detail(body: str) -> str:
    """The vendor's own words: ``{"error": {"type"/"code", "message"}}`` in both formats."""
    try:
        data = json.loads(body)
    except ValueError:
        return body.strip()[:500] or "(empty body)"
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        kind = error.get("code") or error.get("type") or ""
        return f"{kind}: {error.get('message', '')}".strip(": ")
    return json.dumps(data)[:500]


async def post_json(client: httpx.AsyncClient, url: str, headers: Mapping[str, str], payload: dict[str, Any],
                    vendor: str) -> dict[str, Any]:
    """POST ``payload``; the parsed JSON answer, or the typed error for whatever went wrong."""
    try:
        response = await client.post(url, json=payload, headers=dict(headers))
    except httpx.TimeoutException as exc:
        raise errors.ProviderUnavailable(f"{vendor} did not answer in time ({url}): {exc!r}") from exc
    except httpx.TransportError as exc:
        raise errors.ProviderUnavailable(f"cannot reach {vendor} at {url}: {exc!r}") from exc
    if response.status_code >= 400:
        raise provider_error(response.status_code, response.headers, response.text, vendor)
    try:
        data = response.json()
    except ValueError as exc:
        raise errors.ProviderUnavailable(f"{vendor} answered HTTP {response.status_code} with a body that is "
                                         f"not JSON: {response.text[:200]!r}") from exc
    if not isinstance(data, dict):
        raise errors.ProviderUnavailable(f"{vendor} answered with JSON that is not an object: {data!r:.200}")
    return data


async def post_events(client: httpx.AsyncClient, url: str, headers: Mapping[str, str], payload: dict[str, Any],
                      vendor: str) -> AsyncIterator[tuple[str, str]]:
    """POST ``payload`` and yield the server-sent events of the answer as ``(event, data)``, each
    as soon as its blank line arrives (``event`` is ``message`` where the server names none).

    A refusal (an HTTP error status) is the typed error of ``post_json``; a connection that
    breaks or times out mid-answer is ProviderUnavailable, as a call that got no answer."""
    try:
        async with client.stream("POST", url, json=payload, headers=dict(headers)) as response:
            if response.status_code >= 400:
                body = (await response.aread()).decode("utf-8", "replace")
                raise provider_error(response.status_code, response.headers, body, vendor)
            kind = response.headers.get("content-type", "")
            if not kind.startswith("text/event-stream"):
                body = (await response.aread()).decode("utf-8", "replace")
                raise errors.ProviderUnavailable(f"{vendor} answered a streamed request with {kind or 'no type'}, "
                                                 f"not server-sent events: {body[:200]!r}")
            event, data = "message", list[str]()
            async for line in response.aiter_lines():
                if not line:  # a blank line ends the event
                    if data:
                        yield event, "\n".join(data)
                    event, data = "message", []
                elif line.startswith("data:"):
                    data.append(line[5:].removeprefix(" "))
                elif line.startswith("event:"):
                    event = line[6:].strip()
                # ``id:``, ``retry:`` and ``:`` comments (keep-alives) carry nothing for a model's answer
            if data:
                yield event, "\n".join(data)
    except httpx.TimeoutException as exc:
        raise errors.ProviderUnavailable(f"{vendor} stopped answering in time ({url}): {exc!r}") from exc
    except httpx.TransportError as exc:
        raise errors.ProviderUnavailable(f"the stream from {vendor} at {url} broke: {exc!r}") from exc


def event_json(data: str, vendor: str) -> dict[str, Any]:
    """One event's data as the JSON object it must be."""
    try:
        value = json.loads(data)
    except ValueError as exc:
        raise errors.ProviderUnavailable(f"{vendor} streamed an event that is not JSON: {data[:200]!r}") from exc
    if not isinstance(value, dict):
        raise errors.ProviderUnavailable(f"{vendor} streamed JSON that is not an object: {data[:200]!r}")
    return value


_TRANSIENT = ("timeout", "connection", "connect", "unavailable", "overloaded", "internalserver", "network")
"""Words in an exception class's name (or its bases') that mark a failure worth retrying."""


def error_of_exception(exc: Exception, who: str) -> errors.ProviderError:
    """A model library's failure (a LangChain chat model's, a CrewAI LLM's, its vendor SDK's) as
    the kernel's typed error, by kind; ``who`` names the model in the message.

    An HTTP status the exception carries decides first (429 is RateLimited with its
    Retry-After, 5xx ProviderUnavailable, other 4xx BadRequest and friends). Without one, a
    connection or timeout failure (by the standard library's types, or by the vendor SDK's
    class names: ``APIConnectionError``, ``APITimeoutError``, ``ServiceUnavailableError``) may
    pass on retry, so it is ProviderUnavailable; a context overflow by its type's name or the
    vendors' words is ContextTooLong. Anything else (a ``TypeError`` in the model,
    a bad argument) would fail the same way again: a plain ProviderError, never retried."""
    if isinstance(exc, errors.ProviderError):
        return exc
    status = getattr(exc, "status_code", None) or getattr(getattr(exc, "response", None), "status_code", None)
    message = f"{type(exc).__name__}: {exc}"
    if isinstance(status, int):
        headers = getattr(getattr(exc, "response", None), "headers", None) or {}
        return provider_error(status, headers, message, who)
    names = " ".join(cls.__name__.lower() for cls in type(exc).__mro__)
    if "ratelimit" in names:
        return errors.RateLimited(message)
    if "contextlength" in names or "contextwindow" in names or any(m in message.lower() for m in _CONTEXT_OVERFLOW):
        return errors.ContextTooLong(message)  # a library that re-raises the 400 as its own type (CrewAI)
    if isinstance(exc, (ConnectionError, TimeoutError)) or any(word in names for word in _TRANSIENT):
        return errors.ProviderUnavailable(message)
    return errors.ProviderError(message)
