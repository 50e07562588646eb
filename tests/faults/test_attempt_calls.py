"""Calls belong to the attempt that made them (issue 36, defect 2). A real ``agl client`` reaches the server through
a relay that loses its heartbeats, so its lease expires while its agent keeps calling the proxy; a second real client
runs the next attempt. Whichever attempt's result is taken, the stored rollout holds exactly that attempt's calls,
each joined with the proxy's record (token ids)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import httpx
from _harness import ServerRelay, fault_client
from polling import wait_for

from agentlightning.server import LightningServer, Settings
from agentlightning.testing import MockLLMServer

SETTINGS = Settings(lease_seconds=2.0, requeue_delay=0.2, max_attempts=3)


def test_a_stale_worker_calling_after_its_lease_expired_leaves_the_new_attempts_calls_alone(tmp_path: Path) -> None:
    """Before: the stale worker's calls were recorded under the running attempt and joined its stored rollout."""
    stale_calls, new_attempt_ends, stale_ends = tmp_path / "stale-calls", tmp_path / "new-ends", tmp_path / "stale-ends"
    script = {
        "1": ["call", f"wait:{stale_calls}", "call", "call", f"wait:{stale_ends}"],
        "2": ["call", f"wait:{new_attempt_ends}", "call"],
    }
    with _two_attempts(tmp_path, script) as (server, rollout_id, stale_relay):
        stale_calls.touch()  # the stale worker calls while attempt 2 runs: served, and kept as attempt 1's
        wait_for(lambda: len(server.store.proxy_calls(rollout_id, 1)) == 3, 30, "the stale worker's two later calls")
        new_attempt_ends.touch()
        [rollout] = server.wait([rollout_id], timeout=60)
        assert (rollout.status, rollout.attempt) == ("succeeded", 2)
        _assert_calls_of(server, rollout_id, attempt=2, steps=[0, 2])
        stale_ends.touch()  # its success now comes too late: refused, the stored rollout unchanged
        wait_for(lambda: ("POST", f"/rollouts/{rollout_id}/result", 409) in stale_relay.answered, 60, "the refusal")
        _assert_calls_of(server, rollout_id, attempt=2, steps=[0, 2])
        assert [call["metadata"]["attempt"] for call in _proxy_calls(server, rollout_id)] == [1, 2, 1, 1, 2]
        assert [a.status for a in server.store.attempts(rollout_id)] == ["lease_expired", "succeeded"]


def test_a_stale_success_that_wins_keeps_its_own_later_calls(tmp_path: Path) -> None:
    """Before: the stale worker's calls after the re-lease were recorded under attempt 2, so attempt 1's stored
    rollout lacked their proxy records (no exact token ids)."""
    stale_goes_on, never = tmp_path / "stale-goes-on", tmp_path / "never"
    script = {"1": ["call", f"wait:{stale_goes_on}", "call", "call"], "2": ["call", f"wait:{never}", "call"]}
    with _two_attempts(tmp_path, script) as (server, rollout_id, _):
        stale_goes_on.touch()  # attempt 1 makes two more calls and reports success while attempt 2 runs
        [rollout] = server.wait([rollout_id], timeout=60)
        assert (rollout.status, rollout.attempt) == ("succeeded", 1)
        _assert_calls_of(server, rollout_id, attempt=1, steps=[0, 2, 3])
        assert [a.status for a in server.store.attempts(rollout_id)] == ["succeeded", "superseded"]
        assert [call["metadata"]["attempt"] for call in _proxy_calls(server, rollout_id)] == [1, 2, 1, 1]


@contextlib.contextmanager
def _two_attempts(tmp_path: Path, script: dict[str, list[str]]) -> Iterator[tuple[LightningServer, str, ServerRelay]]:
    """A rollout of ``script`` whose attempt 1 made its first call and lost its lease (its worker's heartbeats are
    dropped from then on) and whose attempt 2, on a second client, made its first call. Yields the server, the
    rollout id and the relay the first client reaches the server through."""
    task = {"id": "task", "mode": "script", "script": script}
    with (
        MockLLMServer() as mock,
        LightningServer(
            tmp_path / "s.db", upstream_url=mock.base_url, model_name="mock-model", settings=SETTINGS
        ) as server,
    ):
        stale_relay = ServerRelay(server.url)
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        try:
            with fault_client([task], tmp_path / "a", server, nworkers=1, server_url=stale_relay.url) as (_, dataset):
                [rollout_id] = server.enqueue(dataset)
                wait_for(lambda: len(server.store.proxy_calls(rollout_id, 1)) == 1, 60, "attempt 1's first call")
                stale_relay.drop_heartbeats = True
                wait_for(
                    lambda: server.store.rollout_state(rollout_id) == ("queued", 2), 30, "attempt 1's lease to expire"
                )
                with fault_client([task], tmp_path / "b", server, nworkers=1):
                    wait_for(lambda: len(server.store.proxy_calls(rollout_id, 2)) == 1, 60, "attempt 2's first call")
                    yield server, rollout_id, stale_relay
                    server.request_stop()
        finally:
            stale_relay.stop()


def _assert_calls_of(server: LightningServer, rollout_id: str, attempt: int, steps: list[int]) -> None:
    """The stored calls are exactly ``attempt``'s, in order, each joined with its proxy record (exact token ids)."""
    rollout = server.store.get_rollout(rollout_id)
    assert rollout is not None
    asked = [call.input[-1]["content"] for call in rollout.calls]
    assert asked == [f"task attempt {attempt} step {step}" for step in steps], asked
    attempt_of = {record["call_id"]: record["metadata"].get("attempt") for record in _proxy_calls(server, rollout_id)}
    assert [call.token_source for call in rollout.calls] == ["server"] * len(steps)
    assert all(call.prompt_token_ids and call.completion_token_ids for call in rollout.calls)
    assert [attempt_of[call.metadata["proxy_call_id"]] for call in rollout.calls] == [attempt] * len(steps)


def _proxy_calls(server: LightningServer, rollout_id: str) -> list[dict]:
    """The proxy's records of every attempt, as ``GET /rollouts/{id}/proxy_calls`` answers them."""
    answer = httpx.get(f"{server.url}/rollouts/{rollout_id}/proxy_calls", timeout=10)
    answer.raise_for_status()
    return answer.json()
