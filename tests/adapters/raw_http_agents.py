"""An agent that speaks the OpenAI API with plain httpx (no openai client), at module level so that worker
processes can import it by reference."""

from __future__ import annotations

import httpx

import agentlightning as agl


@agl.rollout
def raw_http_agent(task: dict, llm: agl.LLM) -> float:
    """Two chat calls sent by hand, one streamed, as an OpenAI-compatible server's docs show them."""
    body = {"model": llm.model, "messages": [{"role": "user", "content": task["question"]}]}
    headers = {"Authorization": f"Bearer {llm.api_key}"}
    answer = httpx.post(f"{llm.base_url}/chat/completions", json=body, headers=headers, timeout=30).json()
    with httpx.stream("POST", f"{llm.base_url}/chat/completions", json={**body, "stream": True}, headers=headers,
                      timeout=30) as response:
        events = [line for line in response.iter_lines() if line.startswith("data:")]
    return float(task["question"] in answer["choices"][0]["message"]["content"] and len(events) > 1)
