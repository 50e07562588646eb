"""Token ids of an LLM call: the recorded ones, or — as an explicit, logged fallback — re-tokenized text.

Recorded ids come from the serving side (``token_source`` 'server': our proxy, 'response': fields the backend
returned to the client). Re-tokenizing text can drift from what the model actually sampled (merges across the
prompt/completion boundary, chat-template details), so it happens only when the caller passes a tokenizer, and
the transition is marked ``token_source='retokenized'``.
"""

from __future__ import annotations

import inspect
from typing import Any, Protocol

from agentlightning.errors import RetokenizeError
from agentlightning.types import Call


class Tokenizer(Protocol):
    """What re-tokenization needs: ``encode(text)``; ``apply_chat_template`` is used for chat messages."""

    def encode(self, text: str, *args: Any, **kwargs: Any) -> list[int]: ...


def _encode(tokenizer: Tokenizer, text: str) -> list[int]:
    """Ids of ``text`` without special tokens added (HF tokenizers add BOS unless told not to)."""
    parameters = inspect.signature(tokenizer.encode).parameters
    if "add_special_tokens" in parameters or any(p.kind == p.VAR_KEYWORD for p in parameters.values()):
        return list(tokenizer.encode(text, add_special_tokens=False))
    return list(tokenizer.encode(text))


def retokenize_prompt(call: Call, tokenizer: Tokenizer) -> list[int]:
    """Prompt ids rebuilt from the call's input (chat template with the generation prompt for messages)."""
    if isinstance(call.input, str):
        return _encode(tokenizer, call.input)
    if isinstance(call.input, list):
        template = getattr(tokenizer, "apply_chat_template", None)
        if template is None:
            raise RetokenizeError("the tokenizer has no apply_chat_template for the chat messages")
        kwargs: dict[str, Any] = {"add_generation_prompt": True, "tokenize": True}
        if call.tools:
            kwargs["tools"] = call.tools
        ids = template(call.input, **kwargs)
        if hasattr(ids, "keys") and "input_ids" in ids:  # transformers may return a BatchEncoding
            ids = ids["input_ids"]
        return [int(i) for i in ids]
    raise RetokenizeError(f"input of type {type(call.input).__name__} is neither text nor chat messages")


def retokenize_completion(call: Call, tokenizer: Tokenizer) -> list[int]:
    """Completion ids rebuilt from the call's text output (EOS appended when the model stopped by itself)."""
    output = call.output
    if isinstance(output, dict) and output.get("tool_calls"):
        raise RetokenizeError("the output holds tool calls, whose token form only the server knows")
    text = output if isinstance(output, str) else output.get("content") if isinstance(output, dict) else None
    if not isinstance(text, str):
        raise RetokenizeError("the call has no text output")
    ids = _encode(tokenizer, text)
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(output, dict) and output.get("finish_reason") == "stop" and isinstance(eos, int):
        ids.append(eos)
    return ids
