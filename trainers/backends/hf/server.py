"""In-process OpenAI-compatible server for a Hugging Face model (CPU or GPU), serving the trainer's live weights.

``HFBackendServer(model, tokenizer)`` listens on 127.0.0.1 and answers:

- ``POST /v1/chat/completions`` (stream or not): the model's chat template with ``tools`` rendered, Hermes-style
  ``<tool_call>{json}</tool_call>`` output parsed into ``tool_calls``; ``temperature``, ``top_p``, ``top_k``,
  ``max_tokens`` / ``max_completion_tokens`` (capped at ``max_tokens_limit``), ``stop``, ``seed``, ``n``;
- ``POST /v1/completions``: a text prompt or a list of token ids;
- ``GET /v1/models``.

Every response carries vLLM-style exact token ids — ``prompt_token_ids`` at the top level and
``choices[i].token_ids`` — whether or not the request asked (``return_token_ids``), per-token ``logprobs`` when
asked, and the ``model_version`` that produced it (also as the ``X-Model-Version`` header). Concurrent requests
are decoded together (see :mod:`agentlightning.trainers.backends.hf.generation`). Streaming responses are sent once the
completion is generated (one content chunk plus a final chunk), with the token ids on the chunks as vLLM does.

With ``policies`` (several policies, one LoRA adapter each on a PEFT model, named after the policy), a request is
served by the adapter of its role (the ``X-AGL-Role`` header), else the adapter its ``model`` names (a policy or a
role name), else the base model; each adapter has its own version, and responses say which
``policy`` served them. Rows of different adapters are decoded in the same batch.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any

from agentlightning.trainers.backends.hf.generation import GenerationEngine, Sample, SamplingParams
from agentlightning.trainers.backends.hf.tool_calls import parse_tool_calls
from agentlightning.trainers.policies import BASE_VERSION, PolicyMap, combined_version
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from agentlightning._uvicorn import BackgroundServer
from agentlightning._wire import payloads
from agentlightning._wire.messages import message_text
from agentlightning._wire.payloads import Choice, Reply
from agentlightning.protocol import ROLE_HEADER

logger = logging.getLogger(__name__)


class BadRequest(ValueError):
    """A request the server cannot serve; answered with HTTP 400 and an OpenAI-style error body."""


class HFBackendServer:
    """OpenAI-compatible endpoint over ``model`` (used live: weight updates show up in the next batch).

    Use as a context manager or call :meth:`start` / :meth:`stop`. Wrap weight changes in :meth:`updating`,
    which pauses generation and sets the new ``model_version``.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        model_name: str = "policy",
        model_version: str = "v0",
        host: str = "127.0.0.1",
        port: int = 0,
        max_batch_size: int = 32,
        batch_wait_s: float = 0.005,
        default_max_tokens: int = 512,
        max_tokens_limit: int | None = None,
        max_model_len: int | None = None,
        always_logprobs: bool = False,
        policies: PolicyMap | None = None,
    ) -> None:
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(
                "HFBackendServer: the tokenizer has no chat_template (see trainers.models.prepare_tokenizer)"
            )
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.host = host
        self.default_max_tokens = default_max_tokens
        # The most tokens an answer gets, whatever a request asks (the trainer's max_completion_length)
        self.max_tokens_limit = max_tokens_limit
        self.always_logprobs = always_logprobs
        # Sampling settings forced on every request (e.g. the trainer's temperature), whatever the agent sends.
        self.sampling_overrides: dict[str, Any] = {}
        self.engine = GenerationEngine(
            model, tokenizer, max_batch_size=max_batch_size, batch_wait_s=batch_wait_s, max_model_len=max_model_len
        )
        self.policies = policies
        self.adapters = list(policies.policies) if policies is not None else []
        if self.adapters:
            self.engine.multi_adapter = True
            self.engine.versions = {name: model_version for name in self.adapters}
            self.engine.versions[None] = BASE_VERSION
            model_version = combined_version(self.engine.versions)
        self.engine.model_version = model_version
        self._port = port
        self._http: BackgroundServer | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>`` (no ``/v1``)."""
        return f"http://{self.host}:{self._port}"

    @property
    def base_url(self) -> str:
        """OpenAI base URL: ``http://127.0.0.1:<port>/v1``."""
        return f"{self.url}/v1"

    @property
    def generates_during_update(self) -> bool:
        """True unless the decoder switches the model to eval mode to decode (several adapters, or modules whose
        training mode matters): an update's forward passes would then see that mode."""
        return not self.engine.decodes_in_eval

    @property
    def last_logprob_gap(self) -> float | None:
        """None: the HF backend serves the trained weights themselves, so there is no gap to measure."""
        return None

    def start(self) -> HFBackendServer:
        """Start the generation thread and the HTTP server; returns once it accepts connections."""
        if self._http is not None:
            return self
        self.engine.start()
        try:
            self._http = BackgroundServer(self._app(), self.host, self._port, name="HFBackendServer").start()
        except RuntimeError:
            self.engine.stop()
            raise
        self._port = self._http.port
        logger.info("HF backend serving %s (%s) at %s", self.model_name, self.model_version, self.base_url)
        return self

    def stop(self) -> None:
        """Stop serving (idempotent)."""
        if self._http is not None:
            self._http.stop()
            self._http = None
        self.engine.stop()

    def __enter__(self) -> HFBackendServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def model_version(self) -> str:
        """Version of the weights served now."""
        return str(self.engine.model_version)

    @contextmanager
    def updating(self, new_version: str, policy: str | None = None) -> Iterator[None]:
        """Pause generation while the block changes the weights; serve them as ``new_version`` afterwards (the
        version of adapter ``policy`` only, with ``adapters``)."""
        with self.engine.paused():
            yield
            if policy is None:
                self.engine.model_version = new_version
                return
            if policy not in self.adapters:
                raise ValueError(f"HFBackendServer.updating(policy={policy!r}): serving adapters {self.adapters}")
            self.engine.versions[policy] = new_version
            self.engine.model_version = combined_version(self.engine.versions)

    def served(self, policy: str | None) -> tuple[str, str]:
        """(model name, version) that serve ``policy``'s adapter (None: the base model)."""
        if policy is None:
            return self.model_name, BASE_VERSION
        return policy, self.engine.versions[policy]

    # -- HTTP ---------------------------------------------------------------------------------------------------

    def _app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/completions", self._completions, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/health", self._health, methods=["GET"]),
            ]
        )

    async def _health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "model_version": self.model_version})

    async def _models(self, request: Request) -> Response:
        cards = [
            {
                "id": name,
                "object": "model",
                "created": 0,
                "owned_by": "agentlightning",
                "model_version": version,
                **({"parent": self.model_name} if name != self.model_name else {}),
            }
            for name, version in [
                self.served(None) if self.adapters else (self.model_name, self.model_version),
                *(self.served(name) for name in self.adapters),
            ]
        ]
        return JSONResponse({"object": "list", "data": cards})

    async def _chat(self, request: Request) -> Response:
        try:
            body = await _json_body(request)
            messages = _messages(body.get("messages"))
            tools = body.get("tools") or None
            prompt_ids = self._render(messages, tools)
            params, n = self._params(body, len(prompt_ids))
            samples, version = await self._run(prompt_ids, params, n, self._adapter(request, body))
        except BadRequest as exc:
            return _error(400, str(exc))
        choices = []
        for sample in samples:
            content, tool_calls = parse_tool_calls(sample.text) if tools else (sample.text, [])
            choices.append(
                Choice(
                    content,
                    tool_calls,
                    "tool_calls" if tool_calls else sample.finish_reason,
                    sample.token_ids,
                    self._logprobs(sample, body),
                )
            )
        reply = self._reply(body, prompt_ids, choices, version, samples[0].adapter)
        if body.get("stream"):
            return StreamingResponse(
                payloads.sse(payloads.chat_chunks(reply, include_usage=True)),
                media_type="text/event-stream",
                headers={"X-Model-Version": version},
            )
        return JSONResponse(payloads.chat_completion(reply), headers={"X-Model-Version": version})

    async def _completions(self, request: Request) -> Response:
        try:
            body = await _json_body(request)
            prompt = body.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
                prompt = prompt[0]
            if isinstance(prompt, str):
                prompt_ids = self.tokenizer.encode(prompt, add_special_tokens=False)
            elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
                prompt_ids = list(prompt)
            else:
                raise BadRequest(f"'prompt' must be a string or a list of token ids, got {json.dumps(prompt)[:80]}")
            if body.get("stream"):
                raise BadRequest("stream=true is not supported on /v1/completions; use /v1/chat/completions")
            params, n = self._params(body, len(prompt_ids))
            samples, version = await self._run(prompt_ids, params, n, self._adapter(request, body))
        except BadRequest as exc:
            return _error(400, str(exc))
        choices = [
            Choice(sample.text, [], sample.finish_reason, sample.token_ids, self._logprobs(sample, body))
            for sample in samples
        ]
        reply = self._reply(body, prompt_ids, choices, version, samples[0].adapter)
        return JSONResponse(payloads.completion(reply), headers={"X-Model-Version": version})

    # -- helpers ------------------------------------------------------------------------------------------------

    def _render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        try:
            rendered = self.tokenizer.apply_chat_template(
                messages, tools=tools, add_generation_prompt=True, tokenize=False
            )
        except Exception as exc:  # noqa: BLE001 - template errors are the request's fault
            raise BadRequest(f"could not render the messages with the chat template: {exc}") from None
        return list(self.tokenizer.encode(rendered, add_special_tokens=False))

    def _params(self, body: dict[str, Any], prompt_length: int) -> tuple[SamplingParams, int]:
        body = {**body, **self.sampling_overrides}
        n = body.get("n") or 1
        if not isinstance(n, int) or n < 1:
            raise BadRequest(f"'n' must be a positive integer, got {n!r}")
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or self.default_max_tokens
        room = self.engine.max_model_len - prompt_length
        if room < 1:
            raise BadRequest(
                f"prompt of {prompt_length} tokens leaves no room in the model's context of "
                f"{self.engine.max_model_len} tokens"
            )
        stop = body.get("stop") or []
        stop = [stop] if isinstance(stop, str) else list(stop)
        try:
            params = SamplingParams(
                max_tokens=min(int(max_tokens), room, self.max_tokens_limit or room),
                temperature=float(body["temperature"]) if body.get("temperature") is not None else 1.0,
                top_p=float(body["top_p"]) if body.get("top_p") is not None else 1.0,
                top_k=int(body["top_k"]) if body.get("top_k") is not None else 0,
                stop=[str(s) for s in stop],
                seed=int(body["seed"]) if body.get("seed") is not None else None,
            )
        except (TypeError, ValueError) as exc:
            raise BadRequest(f"bad sampling parameter: {exc}") from None
        if params.max_tokens < 1 or params.temperature < 0 or not 0 < params.top_p <= 1:
            raise BadRequest(
                f"sampling parameters out of range: max_tokens={params.max_tokens}, "
                f"temperature={params.temperature}, top_p={params.top_p}"
            )
        return params, n

    def _adapter(self, request: Request, body: dict[str, Any]) -> str | None:
        """The adapter serving a request (see the module docstring); None: the base model, or no adapters."""
        if not self.adapters:
            return None
        role = request.headers.get(ROLE_HEADER)
        model = body.get("model")
        assert self.policies is not None
        if role:
            return self.policies.policy_of(role)
        if model in self.adapters:
            return str(model)
        return self.policies.policy_of(model) if isinstance(model, str) else None

    async def _run(
        self, prompt_ids: list[int], params: SamplingParams, n: int, adapter: str | None = None
    ) -> tuple[list[Sample], str]:
        futures = []
        for index in range(n):
            row_params = params
            if params.seed is not None and index:
                row_params = SamplingParams(**{**params.__dict__, "seed": params.seed + index})
            try:
                futures.append(self.engine.submit(prompt_ids, row_params, adapter))
            except ValueError as exc:
                raise BadRequest(str(exc)) from None
        samples = [await asyncio.wrap_future(future) for future in futures]
        # Rows of one request may land in different batches around an update: report the newest version.
        return samples, max((str(sample.model_version) for sample in samples), key=_version_order)

    def _reply(
        self, body: dict[str, Any], prompt_ids: list[int], choices: list[Choice], version: str, adapter: str | None
    ) -> Reply:
        extra = {"model_version": version, **({"policy": adapter} if adapter is not None else {})}
        return Reply(
            model=body.get("model") or self.model_name, choices=choices, prompt_token_ids=prompt_ids, extra=extra
        )

    def _logprobs(self, sample: Sample, body: dict[str, Any]) -> list[dict[str, Any]] | None:
        """The sampled tokens' logprob entries, when the request asked for them (or the server always sends them)."""
        if not (body.get("logprobs") or self.always_logprobs):
            return None
        tokens = [self.tokenizer.decode([token]) for token in sample.token_ids]
        return payloads.token_logprobs(tokens, sample.logprobs)


async def _json_body(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        raise BadRequest("the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


def _messages(raw: Any) -> list[dict[str, Any]]:
    """OpenAI chat messages -> template-ready dicts (content parts joined to text)."""
    if not isinstance(raw, list) or not raw:
        raise BadRequest("'messages' must be a non-empty list")
    messages = []
    for position, message in enumerate(raw):
        if not isinstance(message, dict) or "role" not in message:
            raise BadRequest(f"messages[{position}] must be an object with a 'role', got {json.dumps(message)[:80]}")
        item = dict(message)
        if not isinstance(item.get("content"), (str, list, type(None))):
            raise BadRequest(f"messages[{position}].content must be a string or a list of parts")
        item["content"] = message_text(item.get("content"))
        if item["role"] == "developer":
            item["role"] = "system"
        messages.append(item)
    return messages


def _version_order(version: str) -> tuple[int, str]:
    digits = "".join(ch for ch in version if ch.isdigit())
    return (int(digits) if digits else -1, version)


def _error(status: int, message: str) -> Response:
    logger.warning("HF backend: %s", message)
    return JSONResponse(
        {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}},
        status_code=status,
    )
