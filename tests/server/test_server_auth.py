"""Who may call what on a server with a token: the API docs need it like the API (issue 36, item 9), and each
lease's LLM key opens only its own rollout's proxy routes, through the OpenAI and the Anthropic SDK, across a restart;
every admin route refuses it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from agentlightning.server import LightningServer
from agentlightning.testing import MockLLMServer

TOKEN = "s3cret"
ADMIN = {"authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def server(tmp_path: Path, mock_llm_server: MockLLMServer) -> Iterator[LightningServer]:
    with LightningServer(tmp_path / "store.db", upstream_url=mock_llm_server.base_url, token=TOKEN) as srv:
        yield srv


def _leases(server: LightningServer, n: int) -> list[dict]:
    server.enqueue([{"q": i} for i in range(n)])
    with httpx.Client(base_url=server.url, headers=ADMIN) as admin:
        return [admin.post(f"/workers/w{i}/dequeue").json()["lease"] for i in range(n)]


def _ask(llm: dict, api_key: str | None = None) -> str:
    client = openai.OpenAI(base_url=llm["base_url"], api_key=api_key or llm["api_key"], max_retries=0)
    with client:
        reply = client.chat.completions.create(model=llm["model"], messages=[{"role": "user", "content": "hi"}])
    return reply.choices[0].message.content or ""


def test_api_docs_need_the_token(server: LightningServer, tmp_path: Path, mock_llm_server: MockLLMServer) -> None:
    for path in ("/openapi.json", "/docs", "/redoc"):
        assert httpx.get(f"{server.url}{path}").status_code == 401, path
        assert httpx.get(f"{server.url}{path}", headers={"authorization": "Bearer nope"}).status_code == 403, path
        assert httpx.get(f"{server.url}{path}", headers=ADMIN).status_code == 200, path
    schema = httpx.get(f"{server.url}/openapi.json", headers=ADMIN).json()
    assert "/rollouts/{rollout_id}/result" in schema["paths"]
    assert "/openapi.json" in httpx.get(f"{server.url}/docs", headers=ADMIN).text
    with LightningServer(tmp_path / "open.db", upstream_url=mock_llm_server.base_url) as open_server:
        assert httpx.get(f"{open_server.url}/openapi.json").status_code == 200  # no token set: open on loopback


def test_a_leases_key_reaches_only_its_own_rollouts_proxy(server: LightningServer) -> None:
    first, second = _leases(server, 2)
    key = first["llm"]["api_key"]
    assert key.startswith("agl-rollout-") and TOKEN not in key and key != second["llm"]["api_key"]
    assert _ask(first["llm"]) == "echo: hi"
    models = httpx.get(f"{first['llm']['base_url']}/models", headers={"authorization": f"Bearer {key}"})
    assert models.status_code == 200
    with pytest.raises(
        openai.PermissionDeniedError, match=f"does not open the LLM endpoint of rollout '{second['rollout_id']}'"
    ):
        _ask(second["llm"], api_key=key)
    bearer = {"authorization": f"Bearer {key}"}
    rid = first["rollout_id"]
    admin_routes = [
        ("GET", "/rollouts"),
        ("GET", f"/rollouts/{rid}"),
        ("GET", f"/rollouts/{rid}/proxy_calls"),
        ("POST", f"/rollouts/{second['rollout_id']}/cancel"),
        ("POST", "/workers/intruder/dequeue"),
        ("POST", f"/rollouts/{rid}/heartbeat"),
        ("GET", "/datasets"),
        ("GET", "/stats"),
        ("GET", "/metrics"),
        ("POST", "/stop"),
        ("GET", "/ui/api/rollouts"),
        ("GET", "/openapi.json"),
    ]
    for method, path in admin_routes:
        answer = httpx.request(method, f"{server.url}{path}", headers=bearer, json={})
        assert answer.status_code == 403, (method, path, answer.text)
        assert "only opens its own /rollouts/<rollout_id>/v1/ routes" in answer.json()["error"]["message"]
    assert httpx.get(f"{server.url}/stats", headers={"authorization": TOKEN}).status_code == 403  # no Bearer scheme
    assert not server.runtime.stop_requested
    assert server.store.rollout_state(second["rollout_id"]) == ("running", 1)  # not cancelled
    assert _ask(second["llm"], api_key=TOKEN) == "echo: hi"  # the server's token still opens every route


def test_anthropic_sdk_sends_the_key_as_x_api_key(server: LightningServer) -> None:
    anthropic = pytest.importorskip("anthropic")
    [lease] = _leases(server, 1)
    base_url = lease["llm"]["base_url"].removesuffix("/v1")
    with anthropic.Anthropic(base_url=base_url, api_key=lease["llm"]["api_key"], max_retries=0) as client:
        message = client.messages.create(model="m", max_tokens=16, messages=[{"role": "user", "content": "hi"}])
    assert message.content[0].text == "echo: hi"
    with (
        anthropic.Anthropic(base_url=base_url, api_key="agl-rollout-guessed", max_retries=0) as guessing,
        pytest.raises(anthropic.PermissionDeniedError),
    ):
        guessing.messages.create(model="m", max_tokens=16, messages=[{"role": "user", "content": "hi"}])


def test_a_leases_key_still_opens_its_proxy_after_a_restart(tmp_path: Path, mock_llm_server: MockLLMServer) -> None:
    path = tmp_path / "store.db"
    with LightningServer(path, upstream_url=mock_llm_server.base_url, token=TOKEN) as server:
        [lease] = _leases(server, 1)
    with LightningServer(path, upstream_url=mock_llm_server.base_url, token=TOKEN, port=server.port) as again:
        assert again.store.rollout_state(lease["rollout_id"]) == ("running", 1)
        assert _ask(lease["llm"]) == "echo: hi"
