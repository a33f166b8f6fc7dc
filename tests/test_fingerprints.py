"""The LLM syscall's fingerprint, built by hand for speed, is exactly the generic one: journals
written before (and by the generic path) replay unchanged."""

from __future__ import annotations

import pytest

from ringzero.core.contract.fingerprints import fingerprint, llm_fingerprint
from ringzero.core.contract.types import LLMRequest, Message, ToolCall, ToolSchema

REQUESTS = [
    LLMRequest(messages=(Message("user", "ping"),)),
    LLMRequest(messages=(Message("system", "Ünïcødé ☃ \"quoted\" \\ \n tab\t"), Message("user", "€ 𝄞 emoji 😀")),
               model="gpt-x", max_tokens=512, temperature=0.7, stop=("\n\n", "END")),
    LLMRequest(messages=(Message("user", "add"),
                         Message("assistant", "",
                                 tool_calls=(ToolCall("c1", "add", {"b": 2, "a": [1.5, None, True]}),)),
                         Message("tool", "3", tool_call_id="c1", name="add"),
                         Message("assistant", "thinking", blocks=({"type": "thinking", "z": 1, "a": "x"},))),
               tools=(ToolSchema("add", "Add two numbers", {"type": "object", "properties": {"b": {}, "a": {}}}),),
               temperature=1, max_tokens=0),
    LLMRequest(messages=(Message("user", "x" * 10_000),), temperature=float("nan")),
]


@pytest.mark.parametrize("request_", REQUESTS, ids=range(len(REQUESTS)))
@pytest.mark.parametrize("provider", ["default", "ánthropic \"2\""])
def test_the_llm_fingerprint_is_the_generic_fingerprint_of_the_same_arguments(request_: LLMRequest,
                                                                                provider: str) -> None:
    expected = fingerprint({"provider": provider, "request": request_.to_dict()})
    assert llm_fingerprint(provider, request_) == expected
    assert llm_fingerprint(provider, request_) == expected  # again, with the messages' parts kept


def test_requests_that_differ_anywhere_differ_in_fingerprint() -> None:
    base = LLMRequest(messages=(Message("user", "a"),))
    variants = [LLMRequest(messages=(Message("user", "b"),)), LLMRequest(messages=(Message("system", "a"),)),
                LLMRequest(messages=base.messages, model="m"), LLMRequest(messages=base.messages, max_tokens=1),
                LLMRequest(messages=base.messages, stop=("x",)), LLMRequest(messages=base.messages, temperature=0.0),
                LLMRequest(messages=base.messages, tools=(ToolSchema("t"),))]
    prints = {llm_fingerprint("default", r) for r in [base, *variants]}
    assert len(prints) == len(variants) + 1 and llm_fingerprint("other", base) not in prints
