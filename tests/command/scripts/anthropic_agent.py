"""A command-line agent with a tool loop as Anthropic's tool-use docs write it: ask, run each tool the model asks
for, send the results back, until the model ends its turn. The client reads ANTHROPIC_BASE_URL and
ANTHROPIC_API_KEY from the environment; the city comes from city.txt in the working directory (a copy of the
template), and the final report is written to report.txt."""

import os
from pathlib import Path

import anthropic

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def get_weather(city: str) -> str:
    return f"sunny in {city}"


client = anthropic.Anthropic(max_retries=0)
city = Path("city.txt").read_text().strip()
messages = [{"role": "user", "content": f"What is the weather in {city}?"}]
while True:
    message = client.messages.create(
        model=os.environ["AGL_MODEL"], max_tokens=256, system="You are terse.", tools=[WEATHER], messages=messages
    )
    messages.append({"role": "assistant", "content": message.content})
    if message.stop_reason != "tool_use":
        break
    results = [
        {"type": "tool_result", "tool_use_id": block.id, "content": get_weather(**block.input)}
        for block in message.content
        if block.type == "tool_use"
    ]
    messages.append({"role": "user", "content": results})
Path("report.txt").write_text("".join(block.text for block in message.content if block.type == "text"))
