"""Capture of OpenAI-compatible requests sent with ``httpx2`` (see ``_http``): an agent's own
``httpx2.post(llm.base_url + "/chat/completions", json=...)``, and the openai client's requests that its resource
methods do not record (``client.post``, ``client.request``, as LiteLLM sends them)."""

from __future__ import annotations

import httpx2
from agentlightning.adapters._http import capture

_PATCH = capture(httpx2)
install, uninstall, is_installed = _PATCH.install, _PATCH.uninstall, _PATCH.is_installed
