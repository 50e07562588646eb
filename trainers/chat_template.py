"""A ChatML chat template with Hermes-style tools, for models whose own template cannot render tool calls.

Tools are listed in the system turn inside ``<tools></tools>``; the assistant calls them with
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` and results come back as ``<tool_response>`` turns,
the format Qwen2.5 / Hermes models use and :mod:`agentlightning.trainers.backends.hf.tool_calls` parses.
"""

from __future__ import annotations

from typing import Any

CHATML_TOOLS_TEMPLATE = (
    # No whitespace between tags and no '-' trimming: all text is emitted through {{ ... }} so the rendering does
    # not depend on the trim_blocks / lstrip_blocks settings of the Jinja environment.
    "{% if messages and messages[0]['role'] == 'system' %}"
    "{% set system = messages[0]['content'] %}{% set rest = messages[1:] %}"
    "{% else %}{% set system = default_system | default('You are a helpful assistant.') %}"
    "{% set rest = messages %}{% endif %}"
    "{{ '<|im_start|>system\\n' + system }}"
    "{% if tools %}"
    "{{ '\\n\\n# Tools\\n<tools>' }}"
    "{% for tool in tools %}{{ '\\n' + ((tool.function if tool.function is defined else tool) | tojson) }}{% endfor %}"
    "{{ '\\n</tools>\\nTo call a tool, reply ' }}"
    '{{ \'<tool_call>{"name": <tool-name>, "arguments": <json-object>}</tool_call>\' }}'
    "{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{% for message in rest %}"
    "{% if message['role'] == 'tool' %}"
    "{{ '<|im_start|>user\\n<tool_response>\\n' + message['content'] + '\\n</tool_response><|im_end|>\\n' }}"
    "{% elif message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\\n' + (message['content'] or '') }}"
    "{% for call in message['tool_calls'] or [] %}"
    "{% set fn = call.function if call.function is defined else call %}"
    "{% set args = fn.arguments if fn.arguments is string else (fn.arguments | tojson) %}"
    "{{ '<tool_call>{\"name\": \"' + fn.name + '\", \"arguments\": ' + args + '}</tool_call>' }}"
    "{% endfor %}"
    "{{ '<|im_end|>\\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def renders_tools(tokenizer: Any) -> bool:
    """Whether ``tokenizer``'s chat template shows a tool's name when tools are passed."""
    if not getattr(tokenizer, "chat_template", None):
        return False
    probe = {"type": "function", "function": {"name": "zz_probe_tool", "description": "x", "parameters": {}}}
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}], tools=[probe], tokenize=False, add_generation_prompt=True
        )
    except Exception:  # noqa: BLE001 - a template that fails on tools does not render them
        return False
    return "zz_probe_tool" in text
