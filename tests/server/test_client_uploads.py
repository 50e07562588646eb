"""Client configuration, dataset files, and results that outlive an unreachable server (spool, then resend)."""

from __future__ import annotations

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
