"""Capture of OpenAI-compatible requests sent with ``httpx`` (see ``_http``): an agent's own
``httpx.post(llm.base_url + "/chat/completions", json=...)``, and the openai client's requests that its resource
methods do not record (``client.post``, ``client.request``, as LiteLLM sends them)."""

from __future__ import annotations

import httpx
from agentlightning.adapters._http import capture

_PATCH = capture(httpx)
install, uninstall, is_installed = _PATCH.install, _PATCH.uninstall, _PATCH.is_installed
