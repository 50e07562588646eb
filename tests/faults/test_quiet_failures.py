"""A store that cannot be written for a while: the lease reaper, which meets it four times a second here, logs the
first failure with its traceback, then at most a short line a minute, and says when it works again. Issue 36, item 11
(a full traceback every second while the store was unwritable)."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import httpx
import pytest
from polling import wait_for

from agentlightning.server import LightningServer, Settings
from agentlightning.testing import MockLLMServer


def test_reaper_logs_one_traceback_while_the_store_is_unwritable(
    tmp_path: Path, mock_llm_server: MockLLMServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agentlightning")
    path = tmp_path / "store.db"
    settings = Settings(lease_seconds=1.0, requeue_delay=0.0)
    with LightningServer(path, upstream_url=mock_llm_server.base_url, settings=settings) as server:
        [rid] = server.enqueue([{"q": 1}])
        lease = httpx.post(f"{server.url}/workers/w/dequeue").json()["lease"]
        assert lease["rollout_id"] == rid  # and never heart-beaten: the reaper must expire it
        os.rename(path, tmp_path / "away.db")  # the store file is gone: every write is refused
        time.sleep(3.0)  # the lease expired ~2 s ago; the reaper met the refusal about 8 times
        reaper = [r for r in caplog.records if r.name == "agentlightning.server._app" and "lease reaper" in r.message]
        assert len([r for r in reaper if r.exc_info]) == 1, [r.message for r in reaper]
        assert len(reaper) == 1, [r.message for r in reaper]
        assert server.store.rollout_state(rid) == ("running", 1)  # nothing changed in a store it cannot write

        os.rename(tmp_path / "away.db", path)  # the same file back: writable again
        wait_for(lambda: server.store.rollout_state(rid) == ("queued", 2), 10, "the expired lease to be retried")
        messages = [r.getMessage() for r in caplog.records if r.name == "agentlightning.server._app"]
        assert any(m.startswith("lease reaper works again after ") for m in messages), messages
