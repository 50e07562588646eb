"""A command-line agent that tries what the credentials it was given reach: its own LLM endpoint (OPENAI_BASE_URL with
OPENAI_API_KEY, as the openai SDK reads them), and the server's admin routes with the same key. It prints what
happened as one JSON line, then its reward (1.0)."""

import json
import os

import httpx
from openai import OpenAI

base_url = os.environ["OPENAI_BASE_URL"]
key = os.environ["OPENAI_API_KEY"]
server = base_url.split("/rollouts/")[0]
with OpenAI(max_retries=0) as client:
    answer = client.chat.completions.create(model=os.environ["AGL_MODEL"], messages=[{"role": "user", "content": "hi"}])
admin = {"authorization": f"Bearer {key}"}
seen = {
    "answer": answer.choices[0].message.content,
    "key": key,
    "server_token_in_env": "AGL_SERVER_TOKEN" in os.environ,
    "stats": httpx.get(f"{server}/stats", headers=admin).status_code,
    "rollouts": httpx.get(f"{server}/rollouts", headers=admin).status_code,
    "stop": httpx.post(f"{server}/stop", headers=admin).status_code,
}
print(json.dumps(seen))
print(1.0)
