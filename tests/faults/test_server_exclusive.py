"""A second server on a store file another server holds refuses to start, naming the holder; the lock goes with its
holder's process, kill -9 included. Issue 36, item 8 (the second server's proxy served rollouts the first had
cancelled or expired)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from _harness import AglServer, agl

from agentlightning.server import LightningServer
from agentlightning.server.store import SQLiteStore, StoreInUse
from agentlightning.testing import MockLLMServer


@pytest.fixture(scope="module")
def mock() -> Iterator[MockLLMServer]:
    with MockLLMServer() as server:
        yield server


def test_second_agl_server_on_the_same_store_is_refused_until_the_first_is_killed(
    tmp_path: Path, mock: MockLLMServer
) -> None:
    store = tmp_path / "store.db"
    with AglServer(store, mock.base_url) as first:
        assert first.process is not None
        refused = agl("server", "--port", "0", "--store", str(store), "--upstream", mock.base_url)
        output = refused.communicate(timeout=60)[0].decode()
        assert refused.returncode == 2, output
        assert f"in use by another Lightning Server (pid {first.process.pid} " in output, output
        assert "agl server --store" in output, output
        with pytest.raises(StoreInUse, match=f"pid {first.process.pid} "):
            LightningServer(store, upstream_url=mock.base_url)
        assert first.healthy(), "the first server must keep serving"
        enqueued = first.http.post("/rollouts", json={"tasks": [{"q": 1}]})
        assert enqueued.status_code == 200, enqueued.text

        first.kill()  # kill -9: the kernel drops its lock with the process
        with AglServer(store, mock.base_url) as restarted:
            assert restarted.http.get("/stats").json()["rollouts"] == {"queued": 1}


def test_lightning_server_releases_its_store_when_stopped_or_when_it_cannot_start(
    tmp_path: Path, mock: MockLLMServer
) -> None:
    path = tmp_path / "store.db"
    with LightningServer(path, upstream_url=mock.base_url) as server:
        with pytest.raises(StoreInUse, match="in use by another Lightning Server"):
            LightningServer(path, upstream_url=mock.base_url)  # in the same process too
        reader = SQLiteStore(path)  # readers (agl rollouts --store, the dashboard) take no lock
        assert reader.counts() == {}
        reader.close()
        port = server.port
        with pytest.raises(RuntimeError, match="another process already uses that port"):
            LightningServer(tmp_path / "other.db", upstream_url=mock.base_url, port=port).start()
        LightningServer(tmp_path / "other.db", upstream_url=mock.base_url).start().stop()  # the failed one let go
    with pytest.raises(ValueError, match="must start with http"):
        LightningServer(path, upstream_url="127.0.0.1:1/v1")
    with LightningServer(path, upstream_url=mock.base_url) as again:
        assert again.store.counts() == {}
