"""vLLM backend (GPU): serve the policy with ``vllm serve`` (or use a running server) and push new weights to it.

Two ways to keep vLLM's weights equal to the trainer's after each update:

- ``sync="weights"`` (full fine-tuning): the server is TRL's ``trl vllm-serve`` (vLLM plus a weight-update
  endpoint and NCCL group); :meth:`VLLMBackend.sync` pushes every parameter with TRL's ``VLLMClient``.
- ``sync="lora"``: plain ``vllm serve --enable-lora``; :meth:`VLLMBackend.sync` saves the adapter and hot-loads it
  under a new name (``/v1/load_lora_adapter``), which becomes the model name the proxy sends.

Requests go through the OpenAI-compatible server with ``return_token_ids`` (the Lightning Server's proxy adds it),
so token ids come from vLLM itself. Without vLLM or CUDA, constructing the backend fails with a message saying so.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import httpx

logger = logging.getLogger(__name__)

SyncMode = Literal["weights", "lora"]


class VLLMUnavailable(RuntimeError):
    """vLLM (or CUDA) is missing; the message says what to install or which backend to use instead."""


def check_vllm_available() -> None:
    """Raise :class:`VLLMUnavailable` unless the ``vllm`` package and a CUDA device are present."""
    if importlib.util.find_spec("vllm") is None:
        raise VLLMUnavailable(
            "the vLLM backend needs the vllm package and a CUDA GPU: pip install 'agentlightning[vllm]'. "
            "On a machine without a GPU, train with the Hugging Face backend (agl.train's default)."
        )
    import torch

    if not torch.cuda.is_available():
        raise VLLMUnavailable(
            "vllm is installed but no CUDA device is visible (torch.cuda.is_available() is False); vLLM needs a "
            "GPU. Use the Hugging Face backend on CPU."
        )


class VLLMBackend:
    """A vLLM OpenAI-compatible server for the policy, started here (``model=``) or already running (``url=``)."""

    def __init__(
        self,
        model: str | None = None,
        *,
        url: str | None = None,
        sync: SyncMode = "weights",
        port: int = 8000,
        group_port: int = 51216,
        gpu_memory_utilization: float = 0.5,
        max_model_len: int | None = None,
        extra_args: list[str] | None = None,
        startup_timeout: float = 600.0,
    ) -> None:
        if (model is None) == (url is None):
            raise ValueError("VLLMBackend: give exactly one of model= (start vllm here) or url= (use a running one)")
        if sync not in ("weights", "lora"):
            raise ValueError(f"VLLMBackend(sync={sync!r}): use 'weights' or 'lora'")
        if url is None:
            check_vllm_available()
        self.model = model
        self.sync_mode: SyncMode = sync
        self.port = port
        self.group_port = group_port
        self.url = (url or f"http://127.0.0.1:{port}").rstrip("/").removesuffix("/v1")
        self.model_name = model or ""
        self._process: subprocess.Popen[bytes] | None = None
        self._client: Any = None
        self._args = {
            "gpu_memory_utilization": gpu_memory_utilization,
            "max_model_len": max_model_len,
            "extra_args": list(extra_args or []),
        }
        self.startup_timeout = startup_timeout
        self.lora_version = 0
        self._adapter_dir = Path(tempfile.mkdtemp(prefix="agl-lora-"))

    @property
    def base_url(self) -> str:
        """OpenAI base URL of the server."""
        return f"{self.url}/v1"

    def start(self) -> VLLMBackend:
        """Start the server (when ``model=`` was given) and wait until it answers."""
        if self.model is not None and self._process is None:
            self._process = subprocess.Popen(self._command(), env={**os.environ, "VLLM_LOGGING_LEVEL": "WARNING"})
        self._wait_ready()
        if self.model is None:
            self.model_name = self._served_model()
        if self.sync_mode == "weights":
            from trl.extras.vllm_client import VLLMClient

            self._client = VLLMClient(base_url=self.url, group_port=self.group_port, connection_timeout=60)
            self._client.init_communicator()
        return self

    def _command(self) -> list[str]:
        args = self._args
        if self.sync_mode == "weights":
            command = [sys.executable, "-m", "trl.scripts.vllm_serve", "--model", str(self.model), "--port",
                       str(self.port), "--gpu_memory_utilization", str(args["gpu_memory_utilization"]),
                       "--logprobs_mode", "processed_logprobs"]
            if args["max_model_len"]:
                command += ["--max_model_len", str(args["max_model_len"])]
        else:
            command = ["vllm", "serve", str(self.model), "--port", str(self.port), "--enable-lora",
                       "--gpu-memory-utilization", str(args["gpu_memory_utilization"]),
                       "--logprobs-mode", "processed_logprobs"]
            if args["max_model_len"]:
                command += ["--max-model-len", str(args["max_model_len"])]
        return command + args["extra_args"]

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        probe = "/health/" if self.sync_mode == "weights" else "/health"
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                raise RuntimeError(
                    f"vLLM exited with code {self._process.returncode} while starting: {self._command()}"
                )
            try:
                if httpx.get(self.url + probe, timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        raise TimeoutError(f"vLLM at {self.url} did not become ready within {self.startup_timeout:.0f} s")

    def _served_model(self) -> str:
        models = httpx.get(self.base_url + "/models", timeout=10).json()["data"]
        return str(models[0]["id"])

    def sync(self, model: Any) -> str:
        """Push ``model``'s current weights; return the model name requests should use from now on."""
        started = time.perf_counter()
        if self.sync_mode == "weights":
            if self._client is None:
                raise RuntimeError("VLLMBackend.start() was not called")
            if hasattr(model, "peft_config"):
                raise ValueError("VLLMBackend(sync='weights') pushes full weights; use sync='lora' for a LoRA policy")
            for name, parameter in model.named_parameters():
                self._client.update_named_param(name, parameter.data)
            self._client.reset_prefix_cache()
            served = self.model_name
        else:
            self.lora_version += 1
            served = f"policy-lora-{self.lora_version}"
            path = self._adapter_dir / served
            model.save_pretrained(path)
            response = httpx.post(
                self.base_url.removesuffix("/v1") + "/v1/load_lora_adapter",
                json={"lora_name": served, "lora_path": str(path)}, timeout=120,
            )
            if response.status_code != 200:
                raise RuntimeError(f"vLLM refused the LoRA adapter {served}: {response.status_code} {response.text}")
        logger.info("weights synced to vLLM in %.2f s (%s)", time.perf_counter() - started, served)
        return served

    def stop(self) -> None:
        """Close the weight-sync channel and stop a server started here."""
        if self._client is not None:
            try:
                self._client.close_communicator()
            except Exception:  # noqa: BLE001 - the server may already be gone
                logger.debug("closing the vLLM communicator failed", exc_info=True)
            self._client = None
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
            self._process = None
        shutil.rmtree(self._adapter_dir, ignore_errors=True)

    def __enter__(self) -> VLLMBackend:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
