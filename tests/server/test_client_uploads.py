"""Client configuration, dataset files, and results that outlive an unreachable server (spool, then resend)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import httpx
import pytest

from agentlightning.client._api import ServerAPI, Unreachable, resolve_server_url
from agentlightning.client._client import load_records
from agentlightning.client._worker import WorkerConfig, resend_spooled, upload
from agentlightning.server import LightningServer
from agentlightning.types import Rollout


def test_server_url_from_environment_with_paper_alias(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGL_SERVER_URL", raising=False)
    monkeypatch.delenv("AgentLightningServerUrl", raising=False)
    with pytest.raises(ValueError, match="AGL_SERVER_URL"):
        resolve_server_url(None)
    monkeypatch.setenv("AgentLightningServerUrl", "http://10.0.0.2:4747/")
    assert resolve_server_url(None) == "http://10.0.0.2:4747"
    monkeypatch.setenv("AGL_SERVER_URL", "http://127.0.0.1:9")
    assert resolve_server_url(None) == "http://127.0.0.1:9"
    assert resolve_server_url("http://explicit:1") == "http://explicit:1"
    with pytest.raises(ValueError, match="http://"):
        resolve_server_url("localhost:4747")


def test_dataset_files(tmp_path: Path) -> None:
    (tmp_path / "ok.jsonl").write_text('{"q": 1}\n\n{"q": 2}\n')
    assert load_records(tmp_path / "ok.jsonl") == [{"q": 1}, {"q": 2}]
    (tmp_path / "bad.jsonl").write_text('{"q": 1}\n{"q": \n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        load_records(tmp_path / "bad.jsonl")
    (tmp_path / "list.json").write_text(json.dumps([{"q": 3}]))
    assert load_records(tmp_path / "list.json") == [{"q": 3}]
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        load_records(tmp_path / "missing.jsonl")


def test_result_spooled_when_server_unreachable_then_resent(tmp_path: Path) -> None:
    with LightningServer(tmp_path / "s.db") as server:
        [rid] = server.enqueue([{"q": "spool"}])
        server.store.dequeue("w", 60.0)
        live_url = server.url
        dead = ServerAPI("http://127.0.0.1:9")  # nothing listens there
        with pytest.raises(Unreachable):
            dead.health(retry_for=0.1)
        config = WorkerConfig(
            agent_ref="x:y",
            server_url=dead.server_url,
            token=None,
            worker_id="w",
            spool_dir=str(tmp_path / "spool"),
            log_dir=str(tmp_path),
            upload_retry_seconds=0.2,
        )
        upload(dead, Rollout(rollout_id=rid, status="succeeded", final_reward=2.0), 1, config)
        assert [p.name for p in (tmp_path / "spool").iterdir()] == [f"{rid}-1.json"]
        assert resend_spooled(ServerAPI(live_url), str(tmp_path / "spool")) == 1
        assert list((tmp_path / "spool").iterdir()) == []
        [rollout] = server.wait([rid], timeout=5)
        assert rollout.status == "succeeded" and rollout.final_reward == 2.0
        assert httpx.get(f"{live_url}/rollouts/{rid}").json()["final_reward"] == 2.0


def test_a_spooled_result_this_server_does_not_know_stays_for_the_server_that_leased_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The spool directory is shared by every run on the machine: another run's results must not be deleted (nor
    re-sent every 30 s) by a server that never leased them, while the server that did, and forgot them, drops them."""
    spool_dir = tmp_path / "spool"
    with LightningServer(tmp_path / "s.db") as server:
        api = ServerAPI(server.url)
        config = WorkerConfig(
            agent_ref="x:y",
            server_url="http://127.0.0.1:9",  # another run's server, down now
            token=None,
            worker_id="w",
            spool_dir=str(spool_dir),
            log_dir=str(tmp_path),
            upload_retry_seconds=0.2,
        )
        upload(ServerAPI(config.server_url), Rollout(rollout_id="ro-elsewhere", status="succeeded"), 1, config)
        not_here: set[str] = set()
        assert resend_spooled(api, str(spool_dir), not_here=not_here) == 0
        assert not_here == {"ro-elsewhere-1.json"} and (spool_dir / "ro-elsewhere-1.json").exists()

        # The worker's own server answering 404 (its store replaced): refused for good, not spooled
        ours = dataclasses.replace(config, server_url=server.url)
        with caplog.at_level("WARNING", logger="agentlightning.client._worker"):
            upload(api, Rollout(rollout_id="ro-forgotten", status="succeeded"), 1, ours)
        assert "server refused rollout ro-forgotten attempt 1" in caplog.text
        assert sorted(p.name for p in spool_dir.iterdir()) == ["ro-elsewhere-1.json"]

        # A spooled entry of this very server that it no longer knows is removed
        entry = json.loads((spool_dir / "ro-elsewhere-1.json").read_text())
        (spool_dir / "ro-mine-1.json").write_text(json.dumps({**entry, "server_url": server.url}))
        with caplog.at_level("WARNING", logger="agentlightning.client._worker"):
            assert resend_spooled(api, str(spool_dir), not_here=not_here) == 0
        assert "spooled result ro-mine-1.json refused" in caplog.text
        assert sorted(p.name for p in spool_dir.iterdir()) == ["ro-elsewhere-1.json"]
