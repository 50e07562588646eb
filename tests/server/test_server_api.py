"""The HTTP API: datasets, idempotent results, bad input answered with 4xx and a message, auth, CLI inspection."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from agentlightning._cli import main as agl_main
from agentlightning.client import Client
from agentlightning.errors import AuthError
from agentlightning.server import LightningServer, Settings
from agentlightning.testing import MockLLMServer
from agentlightning.types import Call, Reward, Rollout


@pytest.fixture
def server(tmp_path: Path, mock_llm_server: MockLLMServer) -> Iterator[LightningServer]:
    settings = Settings(max_body_bytes=64 * 1024)
    with LightningServer(
        tmp_path / "store.db", upstream_url=mock_llm_server.base_url, model_name="mock-model", settings=settings
    ) as srv:
        yield srv


def _lease(http: httpx.Client) -> dict:
    body = http.post("/workers/w1/dequeue").json()
    assert body["lease"] is not None, body
    return body["lease"]


def test_dataset_upload_jsonl_reuse_and_enqueue(server: LightningServer) -> None:
    http = httpx.Client(base_url=server.url)
    jsonl = "\n".join(json.dumps({"id": f"t{i}", "q": i}) for i in range(3)) + "\n"
    first = http.post("/datasets", content=jsonl, headers={"content-type": "application/x-ndjson"}).json()
    again = http.post("/datasets", content=jsonl, headers={"content-type": "application/x-ndjson"}).json()
    assert first["dataset_id"] == again["dataset_id"] and first["size"] == 3
    assert [t["task_id"] for t in http.get(f"/datasets/{first['dataset_id']}/tasks").json()] == ["t0", "t1", "t2"]
    ids = http.post("/rollouts", json={"dataset_id": first["dataset_id"], "group_size": 2}).json()["rollout_ids"]
    assert len(ids) == 6
    rows = http.get("/rollouts", params={"dataset_id": first["dataset_id"], "status": "queued"}).json()
    assert {r["rollout_id"] for r in rows} == set(ids)
    client = Client(server.url)
    assert client.upload_dataset([{"id": f"t{i}", "q": i} for i in range(3)]) == first["dataset_id"]
    assert http.post(f"/datasets/{first['dataset_id']}/attach").json()["attached"] == [first["dataset_id"]]
    assert server.wait_for_dataset(timeout=1) == first["dataset_id"]


def test_duplicate_result_uploads_store_one_copy(server: LightningServer) -> None:
    http = httpx.Client(base_url=server.url)
    server.enqueue([{"q": "dup"}])
    lease = _lease(http)
    rollout = Rollout(
        rollout_id=lease["rollout_id"],
        status="succeeded",
        final_reward=0.25,
        calls=[Call(role="writer", input="hi")],
        rewards=[Reward(value=0.25, source="final")],
    )
    body = {"attempt": 1, "worker_id": "w1", "rollout": rollout.model_dump(mode="json")}
    outcomes = [http.post(f"/rollouts/{lease['rollout_id']}/result", json=body).json() for _ in range(3)]
    assert [o["accepted"] for o in outcomes] == [True, False, False]
    assert all(o["duplicate"] for o in outcomes[1:])
    stored = http.get(f"/rollouts/{lease['rollout_id']}").json()
    assert len(stored["calls"]) == 1 and len(stored["rewards"]) == 1 and stored["final_reward"] == 0.25
    assert server.store.counts() == {"succeeded": 1}


def test_result_upload_takes_the_next_lease_and_a_resent_upload_gets_the_same_one(server: LightningServer) -> None:
    http = httpx.Client(base_url=server.url)
    first_id, second_id, third_id = server.enqueue([{"q": i} for i in range(3)])
    lease = _lease(http)
    assert lease["rollout_id"] == first_id

    def report(rollout_id: str, worker_id: str | None = "w1", query: str = "?next=1") -> httpx.Response:
        body = {
            "attempt": 1,
            "worker_id": worker_id,
            "rollout": Rollout(rollout_id=rollout_id, status="succeeded", final_reward=1.0).model_dump(mode="json"),
        }
        return http.post(f"/rollouts/{rollout_id}/result{query}", json=body)

    refused = report(first_id, worker_id=None)  # the next lease would belong to nobody: refused before storing
    assert refused.status_code == 422 and "worker_id" in refused.json()["detail"]
    assert server.store.rollout_state(first_id) == ("running", 1)
    answer = report(first_id).json()
    assert answer["accepted"] and answer["next"]["stop"] is False
    handed = answer["next"]["lease"]
    assert handed["rollout_id"] == second_id and handed["llm"]["base_url"].endswith(
        f"/rollouts/{second_id}/attempts/1/v1"
    )
    again = report(first_id).json()  # the answer was lost and the worker re-sends: same lease, no other one taken
    assert again["duplicate"] and again["next"]["lease"]["rollout_id"] == second_id
    assert server.store.rollout_state(third_id) == ("queued", 1)
    assert report(second_id).json()["next"]["lease"]["rollout_id"] == third_id
    assert report(third_id).json()["next"] == {"lease": None, "stop": False}
    assert "next" not in report(third_id, query="").json()
    http.post("/stop")
    assert report(third_id).json()["next"] == {"lease": None, "stop": True}
    assert server.store.counts() == {"succeeded": 3}


def test_malformed_and_oversized_requests_get_4xx_and_server_keeps_serving(server: LightningServer) -> None:
    http = httpx.Client(base_url=server.url)
    server.enqueue([{"q": "x"}])
    lease = _lease(http)
    rid = lease["rollout_id"]
    bad = http.post(f"/rollouts/{rid}/result", content=b"{not json")
    # FastAPI >= 0.13x leaves a body without a JSON content type to pydantic (the message names ResultUpload);
    # 0.115 parses it with the server's strict reader (the message says it is not valid JSON).
    assert bad.status_code == 422 and (
        "ResultUpload" in bad.json()["detail"] or "not valid JSON" in bad.json()["detail"]
    )
    wrong = http.post(f"/rollouts/{rid}/result", json={"attempt": 0, "rollout": {"status": "exploded"}})
    assert wrong.status_code == 422 and "attempt" in wrong.json()["detail"]
    status = http.post(
        f"/rollouts/{rid}/result",
        json={
            "attempt": 1,
            "worker_id": "w1",
            "rollout": Rollout(rollout_id=rid, status="running").model_dump(mode="json"),
        },
    )
    assert status.status_code == 409 and "final status" in status.json()["detail"]
    lines = http.post("/datasets", content=b'{"a": 1}\n{oops\n', headers={"content-type": "application/jsonl"})
    assert lines.status_code == 400 and "line 2" in lines.json()["detail"]
    assert http.post("/rollouts", json={"group_size": 0, "tasks": [1]}).status_code == 422
    assert http.post("/rollouts", json={"tasks": [1], "dataset_id": "x"}).status_code == 422
    assert http.post("/rollouts", json={"dataset_id": "ds-missing"}).status_code == 404
    assert http.get("/rollouts/ro-missing").status_code == 404
    huge = http.post("/datasets", json={"records": ["x" * 100_000]})
    assert huge.status_code == 413 and "larger than the server's limit" in huge.json()["error"]["message"]
    chunked = http.post("/datasets", content=iter([b"[" * 40_000, b"]" * 40_000]))
    assert chunked.status_code == 413
    proxy = http.post(f"/rollouts/{rid}/v1/chat/completions", content=b"[]")
    assert proxy.status_code == 400 and "JSON object" in proxy.json()["error"]["message"]
    big_prompt = openai.OpenAI(base_url=lease["llm"]["base_url"], api_key="x", max_retries=0)
    with pytest.raises(openai.APIStatusError) as info:
        big_prompt.chat.completions.create(model="m", messages=[{"role": "user", "content": "y" * 100_000}])
    assert info.value.status_code == 413
    # still serving, and the rollout still works
    assert http.get("/health").json()["status"] == "ok"
    reply = big_prompt.chat.completions.create(model="m", messages=[{"role": "user", "content": "small"}])
    assert reply.choices[0].message.content == "echo: small"


def test_auth_required_beyond_loopback_and_enforced_when_set(tmp_path: Path, mock_llm_server: MockLLMServer) -> None:
    with pytest.raises(AuthError, match="without a token"):
        LightningServer(tmp_path / "a.db", host="0.0.0.0")
    with LightningServer(tmp_path / "b.db", upstream_url=mock_llm_server.base_url, token="s3cret") as server:
        assert httpx.get(f"{server.url}/health").status_code == 200
        missing = httpx.get(f"{server.url}/rollouts")
        assert missing.status_code == 401 and "missing bearer token" in missing.json()["error"]["message"]
        wrong = httpx.get(f"{server.url}/rollouts", headers={"authorization": "Bearer nope"})
        assert wrong.status_code == 403
        assert httpx.post(f"{server.url}/workers/w/dequeue").status_code == 401
        ok = httpx.Client(base_url=server.url, headers={"authorization": "Bearer s3cret"})
        server.enqueue([{"q": 1}])
        lease = _lease(ok)
        assert lease["llm"]["api_key"].startswith("agl-rollout-")  # its own key, not the server's token
        agent_client = openai.OpenAI(base_url=lease["llm"]["base_url"], api_key=lease["llm"]["api_key"], max_retries=0)
        assert agent_client.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}]).choices
        intruder = openai.OpenAI(base_url=lease["llm"]["base_url"], api_key="guess", max_retries=0)
        with pytest.raises(openai.PermissionDeniedError):
            intruder.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}])
        with pytest.raises(RuntimeError, match="403"):
            Client(server.url, token="nope").upload_dataset([{"q": 1}])


def test_cli_lists_and_shows_rollouts(server: LightningServer, capsys: pytest.CaptureFixture[str]) -> None:
    http = httpx.Client(base_url=server.url)
    server.enqueue([{"id": "cli-task", "q": "x"}])
    lease = _lease(http)
    llm = openai.OpenAI(base_url=lease["llm"]["base_url"], api_key="x", max_retries=0)
    llm.chat.completions.create(model="m", messages=[{"role": "user", "content": "show me"}])
    rollout = Rollout(
        rollout_id=lease["rollout_id"],
        status="succeeded",
        final_reward=1.0,
        rewards=[Reward(value=1.0, source="final")],
    )
    http.post(
        f"/rollouts/{lease['rollout_id']}/result",
        json={"attempt": 1, "worker_id": "w1", "rollout": rollout.model_dump(mode="json")},
    )
    assert agl_main(["rollouts", "list", "--server-url", server.url]) == 0
    listing = capsys.readouterr().out
    assert lease["rollout_id"] in listing and "succeeded" in listing and "cli-task" in listing
    assert agl_main(["rollouts", "show", lease["rollout_id"], "--server-url", server.url, "--tokens"]) == 0
    shown = capsys.readouterr().out
    assert "echo: show me" in shown and "completion_token_ids=[" in shown and "source=server" in shown
    assert agl_main(["rollouts", "show", "ro-nope", "--server-url", server.url]) == 2
    assert "unknown rollout" in capsys.readouterr().err
    assert agl_main(["rollouts", "list", "--store", str(server.store.path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["rollout_id"] == lease["rollout_id"]
