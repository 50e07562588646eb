"""An agent whose LLM calls are made by another program (``curl``, standing for any non-Python client), at module
level so that worker processes can import it by reference. Capture inside the agent's process cannot see them."""

from __future__ import annotations

import json
import subprocess

import httpx

import agentlightning as agl


def _curl(url: str, api_key: str, body: dict) -> str:
    return subprocess.run(
        [
            "curl",
            "-sSfN",
            "-X",
            "POST",
            url,
            "-H",
            "Content-Type: application/json",
            "-H",
            f"Authorization: Bearer {api_key}",
            "-d",
            json.dumps(body),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout


@agl.rollout
def curl_agent(task: dict, llm: agl.LLM) -> float:
    """Two chat calls, one streamed, as an OpenAI-compatible server's docs show them with curl."""
    body = {"model": llm.model, "messages": [{"role": "user", "content": task["question"]}]}
    answer = json.loads(_curl(f"{llm.base_url}/chat/completions", llm.api_key, body))
    events = [
        line
        for line in _curl(f"{llm.base_url}/chat/completions", llm.api_key, {**body, "stream": True}).splitlines()
        if line.startswith("data:")
    ]
    return float(task["question"] in answer["choices"][0]["message"]["content"] and len(events) > 1)


@agl.rollout
def httpx_agent(task: dict, llm: agl.LLM) -> float:
    """The same two calls sent by hand with httpx, which capture records in the agent's process too."""
    body = {"model": llm.model, "messages": [{"role": "user", "content": task["question"]}]}
    headers = {"Authorization": f"Bearer {llm.api_key}"}
    answer = httpx.post(f"{llm.base_url}/chat/completions", json=body, headers=headers, timeout=30).json()
    with httpx.stream(
        "POST", f"{llm.base_url}/chat/completions", json={**body, "stream": True}, headers=headers, timeout=30
    ) as response:
        events = [line for line in response.iter_lines() if line.startswith("data:")]
    return float(task["question"] in answer["choices"][0]["message"]["content"] and len(events) > 1)


@agl.rollout
def half_captured_agent(task: dict, llm: agl.LLM) -> float:
    """A planner call through the openai client (captured in-process) and an answer call sent with the standard
    library's urllib, a client nothing instruments: only the proxy sees the second one."""
    import urllib.request

    import openai

    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    plan = client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": task["question"]}])
    body = {"model": llm.model, "messages": [{"role": "user", "content": plan.choices[0].message.content}]}
    request = urllib.request.Request(
        f"{llm.base_url}/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {llm.api_key}"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        answer = json.loads(response.read())
    return float(task["question"] in answer["choices"][0]["message"]["content"])


@agl.rollout
def openai_agent(task: dict, llm: agl.LLM) -> float:
    """The same two calls, both through the openai client: everything is captured in-process."""
    import openai

    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    content = task["question"]
    for _ in range(2):
        reply = client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": content}])
        content = reply.choices[0].message.content or ""
    return float(task["question"] in content)
