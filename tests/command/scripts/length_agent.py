"""A command-line agent for the training test: one chat call through the openai SDK (the base URL and key from the
environment); the reward, printed last, depends on the reply so a group of rollouts has different rewards."""

import json
import os

from openai import OpenAI

task = json.loads(os.environ["AGL_TASK"])
reply = OpenAI(max_retries=0).chat.completions.create(
    model=os.environ["AGL_MODEL"], messages=[{"role": "user", "content": task["question"]}], max_tokens=8
)
text = reply.choices[0].message.content or ""
print(f"reply: {text!r}")
print(len(text) % 3 / 2.0)
