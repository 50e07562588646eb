"""Wall-clock steps (NTP, a resumed VM, an operator's ``date -s``) while leases run, and while no server runs: the
store's clock is the wall clock read at open, advanced by the monotonic clock. Issue 36, item 6 (a -600 s step kept
a dead client's rollouts running over 60 s against a 10 s lease; a +60 s step expired every running lease at once).

Stepping the real clock needs root, so each test steps ``time.time`` for the whole process: the server, its store,
uvicorn and httpx all see the step, as they would see a real one; the monotonic clock goes on."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from polling import wait_for

from agentlightning.server import LightningServer, Settings
from agentlightning.testing import MockLLMServer

SETTINGS = Settings(lease_seconds=2.0, requeue_delay=0.1)


class SteppedClock:
    """``time.time`` of this process, stepped by :meth:`step` seconds at a time."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.offset = 0.0
        real = time.time
        monkeypatch.setattr(time, "time", lambda: real() + self.offset)

    def step(self, seconds: float) -> None:
        self.offset += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[SteppedClock]:
    yield SteppedClock(monkeypatch)


@pytest.fixture(scope="module")
def mock() -> Iterator[MockLLMServer]:
    with MockLLMServer() as server:
        yield server


def _lease(http: httpx.Client, worker: str) -> dict:
    return wait_for(lambda: http.post(f"/workers/{worker}/dequeue", params={"wait": 1}).json()["lease"], 10, "a lease")


def _heartbeat(http: httpx.Client, lease: dict, worker: str) -> bool:
    body = {"attempt": lease["attempt"], "worker_id": worker}
    return http.post(f"/rollouts/{lease['rollout_id']}/heartbeat", json=body).json()["ok"]


def test_clock_steps_neither_expire_live_leases_nor_keep_dead_ones(
    tmp_path: Path, mock: MockLLMServer, clock: SteppedClock
) -> None:
    with LightningServer(tmp_path / "s.db", upstream_url=mock.base_url, settings=SETTINGS) as server:
        http = httpx.Client(base_url=server.url)
        server.enqueue([{"q": "live"}, {"q": "dead"}])
        live, dead = _lease(http, "live"), _lease(http, "dead")  # "dead" never heart-beats

        clock.step(+60)
        time.sleep(0.7)  # more than the reaper's interval, well inside the 2 s lease
        assert _heartbeat(http, live, "live"), "a +60 s step expired a live lease"
        assert server.store.rollout_state(dead["rollout_id"]) == ("running", 1), "expired before its lease ran out"

        clock.step(-600)
        stepped = time.monotonic()
        retried = wait_for(
            lambda: _heartbeat(http, live, "live") and server.store.rollout_state(dead["rollout_id"])[1] == 2,
            8,
            "the dead worker's lease to expire after a -600 s step",
        )
        assert retried and time.monotonic() - stepped < 4.0  # its 2 s lease, not 600 s more
        again = _lease(http, "other")  # the retry's delay runs on the same clock
        assert (again["rollout_id"], again["attempt"]) == (dead["rollout_id"], 2)
        assert _heartbeat(http, live, "live")
        assert server.store.rollout_state(live["rollout_id"]) == ("running", 1)
        http.close()


def test_a_restart_gives_running_leases_a_full_lease_whatever_the_clock_did_meanwhile(
    tmp_path: Path, mock: MockLLMServer, clock: SteppedClock
) -> None:
    path = tmp_path / "s.db"
    with LightningServer(path, upstream_url=mock.base_url, settings=SETTINGS) as first:
        http = httpx.Client(base_url=first.url)
        first.enqueue([{"q": "live"}, {"q": "dead"}])
        live, dead = _lease(http, "live"), _lease(http, "dead")
        http.close()
    time.sleep(2.5)  # the server is down longer than the lease: the stored deadlines pass

    started = time.monotonic()  # the store grants the lease as it opens, before the server listens
    with LightningServer(path, upstream_url=mock.base_url, settings=SETTINGS) as second:
        http = httpx.Client(base_url=second.url)
        time.sleep(1.0)
        assert _heartbeat(http, live, "live"), "a worker that waited out the restart lost its lease"
        wait_for(lambda: second.store.rollout_state(dead["rollout_id"])[1] == 2, 8, "the dead worker's lease")
        assert time.monotonic() - started >= 1.9  # a full lease from the restart, then expired
        http.close()

    clock.step(-600)  # while no server runs
    started = time.monotonic()
    with LightningServer(path, upstream_url=mock.base_url, settings=SETTINGS) as third:
        wait_for(lambda: third.store.rollout_state(live["rollout_id"])[1] == 2, 8, "the unattended lease to expire")
        assert 1.9 <= time.monotonic() - started < 4.0  # one lease from the restart, not 600 s more
