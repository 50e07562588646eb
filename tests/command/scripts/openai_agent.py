"""A command-line agent written the way the openai SDK's README writes a call: the client reads OPENAI_BASE_URL and
OPENAI_API_KEY from the environment. The question comes as the first argument, the task as JSON in AGL_TASK; it
writes its answer into the working directory and prints its reward as its last line."""

import json
import os
import sys
from pathlib import Path

from openai import OpenAI

question = sys.argv[1]
task = json.loads(os.environ["AGL_TASK"])
client = OpenAI(max_retries=0)
completion = client.chat.completions.create(
    model=os.environ["AGL_MODEL"],
    messages=[{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": question}],
)
answer = completion.choices[0].message.content or ""
Path("answer.txt").write_text(answer)
print(f"model said: {answer}")
print("files here:", sorted(os.listdir(".")), file=sys.stderr)
print(1.0 if task["expect"] in answer else 0.0)
