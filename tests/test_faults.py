"""1,000 processes x 5 model calls through one gate, while the model server fails on a seeded
random schedule (tests/faults.py): every process ends exited, or failed with the typed error of
the fault it met; none hangs; the server's log and the journals agree on every call; nothing is
retried that must not be, and retries stay within the policy."""

from __future__ import annotations

from pathlib import Path

import pytest

from ringzero.checkpointers import SqliteCheckpointer
from tests.faults import ERROR_OF_FAULT, FAULT_WEIGHTS, run_provider_faults


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("vendor", ["openai", "anthropic"])
async def test_a_thousand_processes_through_a_failing_model_server(tmp_path: Path, vendor: str) -> None:
    run = await run_provider_faults(vendor, processes=1000, calls=5, seed=17, deadline=180,  # type: ignore[arg-type]
                                    store=SqliteCheckpointer(tmp_path / "state.db"))
    assert not run.problems, "\n".join(run.problems[:30])
    assert sum(run.outcomes.values()) == 1000
    assert set(run.outcomes) <= {"exited", *ERROR_OF_FAULT.values()}, run.outcomes
    assert set(run.faults) == set(FAULT_WEIGHTS), f"every kind of fault was injected: {run.faults}"
    # The schedule is such that each way of ending happens: most processes finish, some meet a
    # 400 (not retried) and some run out of retries.
    assert run.outcomes["exited"] > 600 and run.outcomes["BadRequest"] > 0, run.outcomes
    assert run.outcomes["ProviderUnavailable"] + run.outcomes["RateLimited"] > 0, run.outcomes


def test_the_checks_catch_each_kind_of_disagreement() -> None:
    """The harness's own checks, fed disagreements: a clean run above then means something."""
    from ringzero.core.contract.outcomes import Failure, Value
    from ringzero.core.contract.store import JournalEntry
    from tests.faults import Attempt, _disagreements

    def answered(prompt: str) -> JournalEntry:
        return JournalEntry(1, "llm", "fp", "", Value({"message": {"content": f"answer to {prompt}"}}))

    def failed(error: str) -> JournalEntry:
        return JournalEntry(1, "llm", "fp", "", Failure(error, ""))

    call = "pid 1 call 0"
    ok = [Attempt(call, 0, "ok", 0.0)]
    assert _disagreements(ok, {call: ["ok"]}, {1: [answered(call)]}, {}, 4) == []
    assert _disagreements(ok, {call: ["ok"]}, {1: []}, {}, 4) == [f"{call}: the server saw it, no journal holds it"]
    assert _disagreements([], {}, {1: [answered(call)]}, {}, 4) == [
        f"{call}: journaled, but the server or the client never saw it"]
    after_400 = [Attempt(call, 0, "400", 0.0), Attempt(call, 1, "ok", 0.1)]
    assert _disagreements(after_400, {call: ["BadRequest", "ok"]}, {1: [answered(call)]}, {}, 4) == [
        f"{call}: retried after 'BadRequest', which must not be retried"]
    late = [Attempt(call, 0, "ok", 0.0), Attempt(call, 1, "ok", 0.4)]  # the first answer came after the timeout
    assert _disagreements(late, {call: ["timeout", "ok"]}, {1: [answered(call)]}, {}, 4) == []
    too_many = [Attempt(call, i, "500", i * 0.1) for i in range(3)]
    assert _disagreements(too_many, {call: ["ProviderUnavailable"] * 3}, {1: [failed("ProviderUnavailable")]},
                          {}, 1) == [f"{call}: 3 attempts, over the policy's 2"]
    early = [Attempt(call, 0, "429 retry-after", 0.0), Attempt(call, 1, "ok", 0.001)]
    assert "after a 429 that asked for" in _disagreements(early, {call: ["RateLimited", "ok"]},
                                                          {1: [answered(call)]}, {}, 4)[0]
    gave_up = [Attempt(call, 0, "503", 0.0)]
    assert "with retries left" in _disagreements(gave_up, {call: ["ProviderUnavailable"]},
                                                 {1: [failed("ProviderUnavailable")]}, {}, 4)[0]
    mistyped = [Attempt(call, 0, "529", 0.0)]
    assert "the client saw 'RateLimited'" in _disagreements(mistyped, {call: ["RateLimited"]},
                                                             {1: [failed("RateLimited")]}, {}, 0)[0]
    wrong_record = [Attempt(call, 0, "400", 0.0)]
    assert "the journal holds" in _disagreements(wrong_record, {call: ["BadRequest"]},
                                                 {1: [failed("ProviderUnavailable")]}, {}, 4)[0]
