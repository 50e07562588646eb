"""vLLM backend: serve the policy from a vLLM OpenAI server and keep its weights equal to the trainer's.

``VLLMBackend(model=DIR, policy=..., tokenizer=...)`` starts vLLM's OpenAI server
(``vllm.entrypoints.openai.api_server``, through :mod:`~agentlightning.trainers.backends.vllm._launch`, which stops
it if the trainer dies without stopping it) on 127.0.0.1 in a session of its own (with the trainer tokenizer's chat
template, Hermes tool-call parsing and ``--served-model-name``);
``VLLMBackend(url=..., policy=...)`` uses a server someone else started. It implements
:class:`~agentlightning.trainers.backends.base.Backend`: after the block of ``with backend.updating(version):`` changes
the trainer's weights, the new weights are pushed to the server by one of four sync modes:

- ``"lora"`` (any hardware; the default for a LoRA policy): save the PEFT adapter (to ``/dev/shm`` when it exists),
  hot-load it under a new name ``<model_name>-<version>`` (``/v1/load_lora_adapter``) and unload the previous one
  (with ``keep_previous=True``, for asynchronous training, one sync later: requests already running on it finish
  there). :attr:`model_name` changes with every version: requests must name the new adapter.
- ``"disk"`` (any hardware; full fine-tuning; a shared filesystem across machines): save the full weights, pause,
  reload them through the worker extension :mod:`agentlightning.trainers.backends.vllm._worker` (which also re-ties a
  tied ``lm_head``), reset the prefix cache, set the weight version, resume.
- ``"nccl"`` (separate GPUs or machines; full fine-tuning): vLLM's NCCL weight-transfer engine through TRL's
  ``VLLMClient``; the server needs ``--weight-transfer-config '{"backend":"nccl"}'`` (added when started here).
- ``"ipc"`` (trainer and vLLM on one GPU; full fine-tuning): CUDA IPC handles through vLLM's IPC weight-transfer
  engine (``--weight-transfer-config '{"backend":"ipc"}'``); needs vllm importable in the trainer's process.

With ``policies`` (``agl.train(policies=...)``: one LoRA adapter per policy on one PEFT model), ``lora`` sync pushes
one policy's adapter at a time (``updating(version, policy=name)``) as ``<model_name>-<policy>-<version>``; vLLM
serves them all at once (multi-LoRA: ``--enable-lora --max-loras``), each request naming its policy's adapter
(:meth:`VLLMBackend.served`), and the frozen base under ``model_name``.

``nccl`` and ``ipc`` need CUDA and raise :class:`VLLMUnavailable` without it. vLLM cannot force the training
temperature on requests: whoever forwards rollout requests (the Lightning proxy) must merge
:attr:`VLLMBackend.sampling_overrides` into each request body, as the HF backend does itself.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import httpx
from agentlightning.trainers.policies import BASE_VERSION, combined_version

from agentlightning.errors import VLLMUnavailable

logger = logging.getLogger(__name__)

SyncMode = Literal["lora", "disk", "nccl", "ipc"]
SYNC_MODES: tuple[str, ...] = ("lora", "disk", "nccl", "ipc")
LORA_RANKS: tuple[int, ...] = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ``--max-lora-rank`` values vLLM accepts; a server started here gets the smallest one that fits the policy's
adapters (a larger one slows LoRA decoding: on vLLM's CPU build 64 instead of 16 costs 2.4x)."""
DEFAULT_LORA_RANK = 64
"""``--max-lora-rank`` when neither ``max_lora_rank`` nor a PEFT policy says which adapters will be loaded."""
CONNECT_GRACE = 3.0
"""Seconds a server given by ``url=`` may refuse connections before :meth:`VLLMBackend.start` gives up (a server
still loading its model accepts connections; only a closed port refuses them)."""
LAUNCHER = "agl_vllm_launch"
"""The module a server started here runs (a copy of ``_launch.py`` on its ``PYTHONPATH``): vLLM's OpenAI server,
which stops its whole session if the process that started it dies without stopping it (SIGKILL, the OOM killer)."""
WORKER_EXTENSION = "agl_vllm_worker.WeightReloader"
"""``--worker-extension-cls`` of a server started here (a copy of ``_vllm_worker.py`` put on its ``PYTHONPATH``).
A server started by hand in an environment with Agent Lightning uses
``agentlightning.trainers.backends.vllm._worker.WeightReloader``."""


def default_python() -> str:
    """Python that runs a vLLM server started here: the repository's ``.venv-vllm`` if present, else this one."""
    venv = Path(__file__).resolve().parents[3] / ".venv-vllm" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


class VLLMBackend:
    """A vLLM OpenAI-compatible server for the policy, started here (``model=``) or already running (``url=``).

    ``policy`` is the trainer's model (a PEFT model for ``sync="lora"``, a full model otherwise); it can also be
    set later as ``backend.policy``. ``tokenizer``'s chat template is given to a server started here.
    ``max_lora_rank`` None: the largest rank of the policy's adapters, rounded up to one of :data:`LORA_RANKS`.
    """

    def __init__(
        self,
        model: str | os.PathLike[str] | None = None,
        *,
        url: str | None = None,
        policy: Any = None,
        tokenizer: Any = None,
        sync: SyncMode = "lora",
        model_name: str | None = None,
        model_version: str = "v0",
        port: int = 0,
        python: str | None = None,
        dtype: str = "auto",
        gpu_memory_utilization: float = 0.5,
        max_model_len: int | None = None,
        tensor_parallel_size: int = 1,
        max_lora_rank: int | None = None,
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        sync_dir: str | os.PathLike[str] | None = None,
        device: Any = None,
        group_port: int = 51216,
        startup_timeout: float = 600.0,
        request_timeout: float = 300.0,
        check_messages: list[dict[str, Any]] | None = None,
        check_every: int = 1,
        keep_previous: bool = False,
        policies: Any = None,
    ) -> None:
        if (model is None) == (url is None):
            raise ValueError("VLLMBackend: give exactly one of model= (start vLLM here) or url= (use a running one)")
        if sync not in SYNC_MODES:
            raise ValueError(f"VLLMBackend(sync={sync!r}): use one of {', '.join(SYNC_MODES)}")
        if policies is not None and sync != "lora":
            raise ValueError(f"VLLMBackend(policies=..., sync={sync!r}): policies are LoRA adapters; use sync='lora'")
        if isinstance(check_every, bool) or not isinstance(check_every, int) or check_every < 1:
            raise ValueError(f"VLLMBackend(check_every={check_every!r}): must be a positive integer (1: every sync)")
        self.model = None if model is None else str(model)
        self.policy = policy
        self.tokenizer = tokenizer
        self.sync_mode: SyncMode = sync
        self.sampling_overrides: dict[str, Any] = {}
        """Request fields forced on every rollout request; the proxy applies them (vLLM cannot)."""
        self.check_messages = check_messages
        self.last_logprob_gap: float | None = None
        """Largest |vLLM - trainer| token logprob on ``check_messages`` after the last sync (nats), if checked."""
        self.check_every = check_every
        """Check the logprob gap on a policy's first sync, then on every ``check_every``-th one."""
        self._syncs: dict[str | None, int] = {}  # policy (None: the one policy) -> syncs done
        self._base_name = model_name
        self._model_name = model_name or ""
        self._version = model_version
        self._port = port
        self._url = None if url is None else url.rstrip("/").removesuffix("/v1")
        self.python = python or default_python()
        self._server_args = {
            "dtype": dtype,
            "gpu_memory_utilization": gpu_memory_utilization,
            "max_model_len": max_model_len,
            "tensor_parallel_size": tensor_parallel_size,
            "max_lora_rank": max_lora_rank,
        }
        self.extra_args = list(extra_args)
        self.env = dict(env or {})
        self.device = device
        self.group_port = group_port
        self.startup_timeout = startup_timeout
        self.request_timeout = request_timeout
        shm = Path("/dev/shm")
        self._sync_root = sync_dir or (shm if sync == "lora" and url is None and shm.is_dir() else None)
        self._files: Path | None = None  # chat template, worker module, server log, saved weights; made by start()
        self._process: subprocess.Popen[bytes] | None = None
        self._log_path = Path()  # the started server's output, in its temporary directory
        self._http: httpx.Client | None = None
        self._adapter: str | None = None
        self._keep_previous = keep_previous
        self._retired: str | None = None  # the previous adapter, still loaded for requests running on it
        self._transfer: Any = None  # TRL's VLLMClient (nccl) or vLLM's IPC trainer engine (ipc)
        self.policies = policies  # a PolicyMap: one adapter per policy
        self._loaded: dict[str, tuple[str, str]] = {}  # policy -> (adapter name served, version)
        self._retired_by: dict[str, str] = {}  # policy -> its previous adapter, still loaded (keep_previous)

    # -- the Backend protocol -------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """Server root, ``http://127.0.0.1:<port>`` when started here (no ``/v1``)."""
        return self._url or f"http://127.0.0.1:{self._port}"

    @property
    def base_url(self) -> str:
        """OpenAI base URL: ``<url>/v1``."""
        return f"{self.url}/v1"

    @property
    def model_name(self) -> str:
        """The ``model`` requests name: the served model, or with ``sync="lora"`` the adapter of this version."""
        return self._model_name

    @property
    def model_version(self) -> str:
        """Version of the weights served now."""
        return self._version

    def start(self) -> VLLMBackend:
        """Start the server (``model=``) or check the running one (``url=``); returns once it answers."""
        if self._http is not None:
            return self
        if self.sync_mode in ("nccl", "ipc"):
            _require_cuda(self.sync_mode)
        self._files = Path(tempfile.mkdtemp(prefix="agl-vllm-", dir=self._sync_root))
        try:
            if self.model is not None:
                self._launch()
            self._http = httpx.Client(base_url=self.url, timeout=self.request_timeout, follow_redirects=True)
            models = self._wait_ready()
            if not self._base_name:
                self._base_name = next(str(m["id"]) for m in models if not m.get("parent"))
            self._model_name = self._base_name
            if self.sync_mode == "nccl":
                from trl.generation.vllm_client import VLLMClient

                self._transfer = VLLMClient(base_url=self.url, group_port=self.group_port, connection_timeout=60)
                self._transfer.init_communicator(device=self.device if self.device is not None else "cuda:0")
            elif self.sync_mode == "ipc":
                self._transfer = self._ipc_engine()
        except BaseException:
            self.stop()
            raise
        logger.info(
            "vLLM serving %s (%s) at %s, sync=%s", self.model_name, self.model_version, self.base_url, self.sync_mode
        )
        return self

    def stop(self) -> None:
        """Close the weight-transfer channel, unload the LoRA adapter from a server used by URL, stop a server
        started here, remove temporary files (idempotent)."""
        if self.sync_mode == "nccl" and self._transfer is not None:
            self._transfer.close_communicator()
        self._transfer = None
        loaded = [name for name, _ in self._loaded.values()] + list(self._retired_by.values())
        for adapter in (self._adapter, self._retired, *loaded):
            if self._http is not None and self._process is None and adapter is not None:
                # A server someone else runs keeps running: take back the adapters loaded here (names may be reused).
                try:
                    self._http.post("/v1/unload_lora_adapter", json={"lora_name": adapter}).raise_for_status()
                except httpx.HTTPError as exc:
                    logger.warning("could not unload LoRA adapter %s: %s", adapter, exc)
        self._adapter = self._retired = None
        self._loaded.clear()
        self._retired_by.clear()
        if self._http is not None:
            self._http.close()
            self._http = None
        if self._process is not None:
            _stop_process_group(self._process)
            self._process = None
        if self._files is not None:
            shutil.rmtree(self._files, ignore_errors=True)
            self._files = None

    def __enter__(self) -> VLLMBackend:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @contextmanager
    def updating(self, new_version: str, policy: str | None = None) -> Iterator[None]:
        """The block changes ``policy``'s weights; on exit they are pushed to vLLM and served as ``new_version``
        (with ``policies``: the adapter of policy ``policy``)."""
        yield
        if self.policy is None:
            raise RuntimeError("VLLMBackend.updating: set backend.policy (the trainer's model) before syncing")
        if self.policies is not None:
            self._sync_policy(policy, new_version)
            return
        started = time.perf_counter()
        {"lora": self._sync_lora, "disk": self._sync_disk, "nccl": self._sync_transfer, "ipc": self._sync_transfer}[
            self.sync_mode
        ](new_version)
        self._version = new_version
        logger.info(
            "weights synced to vLLM (%s) in %.2f s as %s",
            self.sync_mode,
            time.perf_counter() - started,
            self.model_name,
        )
        self._check_after_sync(None)

    @property
    def generates_during_update(self) -> bool:
        """False: vLLM serves a copy of the weights, synced on leaving :meth:`updating`."""
        return False

    def served(self, policy: str | None) -> tuple[str, str]:
        """(model name, version) that serve ``policy``'s adapter now (None: the frozen base)."""
        if policy is None:
            return self._base_name or self._model_name, BASE_VERSION
        if policy not in self._loaded:
            raise RuntimeError(f"VLLMBackend: policy {policy!r} has no adapter loaded yet (updating(..., policy=))")
        return self._loaded[policy]

    # -- sync modes -----------------------------------------------------------------------------------------------

    def _sync_policy(self, policy: str | None, version: str) -> None:
        """Save policy ``policy``'s adapter, load it under a new name, retire its previous one (multi-LoRA)."""
        if policy is None or policy not in self.policies.policies:
            raise ValueError(f"VLLMBackend.updating(policy={policy!r}): give one of {list(self.policies.policies)}")
        started = time.perf_counter()
        name = f"{self._base_name}-{policy}-{version}"
        self.policy.save_pretrained(self._dir / name, selected_adapters=[policy])
        path = self._dir / name / (policy if policy != "default" else "")  # PEFT's folder for a named adapter
        self._load_adapter(name, path)
        previous = self._loaded.get(policy, (None,))[0]
        self._loaded[policy] = (name, version)
        if self._keep_previous and previous is not None:
            retired = self._retired_by.get(policy)  # the one before: unloaded now, one update later than without
            self._retired_by[policy] = previous
            previous = retired
        if previous is not None:
            self._post("/v1/unload_lora_adapter", json={"lora_name": previous})
            shutil.rmtree(self._dir / previous, ignore_errors=True)
        self._version = combined_version({name: loaded[1] for name, loaded in self._loaded.items()})
        logger.info("policy %s synced to vLLM in %.2f s as %s", policy, time.perf_counter() - started, name)
        self._check_after_sync(policy)

    def _sync_lora(self, version: str) -> None:
        if not hasattr(self.policy, "peft_config"):
            raise ValueError("VLLMBackend(sync='lora') needs a PEFT policy; use sync='disk' for full fine-tuning")
        name = f"{self._base_name}-{version}"
        path = self._dir / name
        self.policy.save_pretrained(path)
        self._load_adapter(name, path)
        previous, self._adapter, self._model_name = self._adapter, name, name
        if self._keep_previous:
            previous, self._retired = self._retired, previous
        if previous is not None:
            self._post("/v1/unload_lora_adapter", json={"lora_name": previous})
            shutil.rmtree(self._dir / previous, ignore_errors=True)

    def _sync_disk(self, version: str) -> None:
        _require_full_model(self.policy, "disk")
        path = self._dir / "weights"
        self.policy.save_pretrained(path)
        self._post("/pause", params={"mode": "wait"})
        try:
            self._post("/collective_rpc", json={"method": "agl_reload_weights", "kwargs": {"weights_path": str(path)}})
            self._post("/reset_prefix_cache")
            self._post("/update_weight_version", json={"new_version": version})
        finally:
            self._post("/resume")

    def _sync_transfer(self, version: str) -> None:
        _require_full_model(self.policy, self.sync_mode)
        if self.sync_mode == "nccl":
            self._transfer.update_model_params(self.policy)
        else:
            self._transfer.send_weights()
        self._post("/reset_prefix_cache")
        self._post("/update_weight_version", json={"new_version": version})

    def _ipc_engine(self) -> Any:
        try:
            from vllm.distributed.weight_transfer.base import ModuleSource
            from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
            from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo, IPCTrainerWeightTransferEngine
        except ImportError as exc:
            raise VLLMUnavailable(f"sync='ipc' needs vllm in the trainer's environment ({exc})") from exc
        _require_full_model(self.policy, "ipc")
        return IPCTrainerWeightTransferEngine.trainer_init(
            IPCTrainerInitInfo(rank=0),
            client=HTTPVLLMWeightSyncClient(self.url, timeout=self.request_timeout),
            source=ModuleSource(self.policy),
        )

    # -- checks ---------------------------------------------------------------------------------------------------

    def _check_after_sync(self, policy: str | None) -> None:
        """Measure :attr:`last_logprob_gap` on ``policy``'s first sync and every ``check_every``-th one (else None:
        not measured this time)."""
        done = self._syncs.get(policy, 0)
        self._syncs[policy] = done + 1
        self.last_logprob_gap = None
        if self.check_messages is None or done % self.check_every:
            return
        self.last_logprob_gap = self.logprob_gap(self.check_messages, policy=policy)
        logger.info("sampler/trainer logprob gap after sync %d: %.2e nats", done + 1, self.last_logprob_gap)

    def logprob_gap(self, messages: list[dict[str, Any]], max_tokens: int = 8, policy: str | None = None) -> float:
        """Sample ``max_tokens`` from vLLM for ``messages``; return the largest |vLLM - ``policy``| token logprob
        (with ``policies``: of that policy's adapter)."""
        import torch

        served = {"model": self.served(policy)[0]} if policy is not None else {}
        if policy is not None:
            self.policy.set_adapter(policy)
        response = self.chat(messages, max_tokens=max_tokens, temperature=1.0, seed=0, logprobs=True, **served)
        choice = response["choices"][0]
        prompt, completion = response["prompt_token_ids"], choice["token_ids"]
        sampled = torch.tensor([entry["logprob"] for entry in choice["logprobs"]["content"]], dtype=torch.float64)
        device = next(self.policy.parameters()).device
        with torch.no_grad():
            logits = self.policy(torch.tensor([prompt + completion], device=device)).logits[0, len(prompt) - 1 : -1]
        trainer = torch.log_softmax(logits.double(), dim=-1).gather(1, torch.tensor(completion, device=device)[:, None])
        return float((trainer[:, 0].cpu() - sampled).abs().max())

    def chat(self, messages: list[dict[str, Any]], **body: Any) -> dict[str, Any]:
        """One chat completion from the served policy with vLLM's token ids (a convenience for checks and tests)."""
        payload = {"model": self.model_name, "messages": messages, "return_token_ids": True, **body}
        return self._post("/v1/chat/completions", json=payload).json()

    # -- server process -------------------------------------------------------------------------------------------

    def command(self) -> list[str]:
        """The command line of a server started here (after :meth:`start` made its files)."""
        args = self._server_args
        command = [
            self.python,
            "-m",
            LAUNCHER,  # vllm.entrypoints.openai.api_server, stopped if this process dies
            "--model",
            str(self.model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self._port),
            "--served-model-name",
            self._base_name or "policy",
            "--dtype",
            str(args["dtype"]),
            "--gpu-memory-utilization",
            str(args["gpu_memory_utilization"]),
            "--tensor-parallel-size",
            str(args["tensor_parallel_size"]),
            "--logprobs-mode",
            "processed_logprobs",
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            "hermes",
            "--worker-extension-cls",
            WORKER_EXTENSION,
        ]
        if args["max_model_len"]:
            command += ["--max-model-len", str(args["max_model_len"])]
        if self.tokenizer is not None and getattr(self.tokenizer, "chat_template", None):
            template = self._dir / "chat_template.jinja"
            template.write_text(self.tokenizer.chat_template)
            command += ["--chat-template", str(template)]
        if self.sync_mode == "lora":
            rank = args["max_lora_rank"] or served_lora_rank(self.policy)
            # Every policy's adapter in one batch (one without policies), and its previous one while kept.
            adapters = len(self.policies.policies) if self.policies is not None else 1
            count = adapters * (2 if self._keep_previous else 1)
            command += ["--enable-lora", "--max-lora-rank", str(rank), "--max-loras", str(count)]
        elif self.sync_mode in ("nccl", "ipc"):
            command += ["--weight-transfer-config", f'{{"backend": "{self.sync_mode}"}}']
        return command + self.extra_args

    def _launch(self) -> None:
        if not Path(self.python).exists() and shutil.which(self.python) is None:
            raise VLLMUnavailable(f"no Python at {self.python} to run vLLM; `make vllm-venv` creates .venv-vllm")
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: closed connections don't count
            try:
                probe.bind(("127.0.0.1", self._port))
            except OSError as exc:
                raise VLLMUnavailable(
                    f"VLLMBackend(port={self._port}): 127.0.0.1:{self._port} is taken ({exc}), maybe by another "
                    "server; give another port, or 0 to pick a free one"
                ) from exc
            self._port = probe.getsockname()[1]
        self._base_name = self._base_name or "policy"
        shutil.copy(Path(__file__).with_name("_worker.py"), self._dir / "agl_vllm_worker.py")
        shutil.copy(Path(__file__).with_name("_launch.py"), self._dir / f"{LAUNCHER}.py")
        env = {
            **os.environ,
            # /collective_rpc, /pause and friends (dev mode) are safe only because the server binds 127.0.0.1.
            "VLLM_SERVER_DEV_MODE": "1",
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(self._dir), os.environ.get("PYTHONPATH")])),
            # The launcher's watch: if this process dies without stopping the server, the server stops itself.
            "AGL_VLLM_PARENT_PID": str(os.getpid()),
            "AGL_VLLM_OWNED_DIR": str(self._dir),
            **self.env,
        }
        command = self.command()
        self._log_path = self._dir / "server.log"
        with open(self._log_path, "wb") as log:
            self._process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        logger.info("starting vLLM: %s (log: %s)", " ".join(command), self._log_path)

    def _wait_ready(self) -> list[dict[str, Any]]:
        """Wait until the server answers ``/v1/models`` and is the one meant; return its models."""
        if self._http is None:
            raise RuntimeError("VLLMBackend.start() was not called")
        started = time.monotonic()
        deadline = started + self.startup_timeout
        foreign: list[str] | None = None  # the models of another server answering on our port
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                tail = self._log_path.read_text(errors="replace")[-3000:]
                raise VLLMUnavailable(f"vLLM exited with code {self._process.returncode} while starting:\n{tail}")
            try:
                response = self._http.get("/v1/models", timeout=5)
            except httpx.ConnectError as exc:
                if self._process is None and time.monotonic() - started > CONNECT_GRACE:
                    raise VLLMUnavailable(
                        f"VLLMBackend(url={self.url!r}): nothing is listening there ({exc}); start the vLLM server "
                        "first, or leave url unset to start one here"
                    ) from exc
            except httpx.HTTPError:
                pass
            else:
                if response.status_code == 200:
                    models = list(response.json().get("data") or [])
                    if self._process is None:
                        return self._checked_remote(models)
                    if self._is_ours(models):
                        return models
                    foreign = [str(m.get("id")) for m in models]
            time.sleep(1.0)
        if foreign is not None:
            raise TimeoutError(
                f"port {self._port} is answered by another server (models {foreign}), not the vLLM started here, "
                f"for {self.startup_timeout:.0f} s; give another port (0 picks a free one)"
            )
        raise TimeoutError(f"vLLM at {self.url} did not answer /v1/models within {self.startup_timeout:.0f} s")

    def _is_ours(self, models: list[dict[str, Any]]) -> bool:
        """Whether ``models`` is what the server started here serves: its name, from its model directory."""
        return any(m.get("id") == self._base_name and m.get("root") == self.model for m in models)

    def _checked_remote(self, models: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``models`` of the server given by ``url=``, once it has shown it is vLLM (``/version``) serving
        ``model_name`` (when given)."""
        assert self._http is not None
        try:
            version = self._http.get("/version", timeout=5)
            is_vllm = version.status_code == 200 and "version" in version.json()
        except (httpx.HTTPError, ValueError):
            is_vllm = False
        names = [str(m.get("id")) for m in models]
        if not is_vllm:
            raise VLLMUnavailable(
                f"VLLMBackend(url={self.url!r}) answers /v1/models (models {names}) but is not a vLLM server "
                "(no /version): weight sync needs vLLM's endpoints"
            )
        if self._base_name and self._base_name not in names:
            raise VLLMUnavailable(f"VLLMBackend(url={self.url!r}) serves {names}, not {self._base_name!r}")
        return models

    @property
    def _dir(self) -> Path:
        if self._files is None:
            raise RuntimeError("VLLMBackend.start() was not called")
        return self._files

    def _load_adapter(self, name: str, path: Path) -> None:
        """Serve the adapter saved at ``path`` as ``name``, in place of one of that name a server used by URL may
        still hold (a run killed before it unloaded its adapters, a resumed run): vLLM refuses a name twice otherwise.
        """
        self._post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(path), "load_inplace": True})

    def _post(self, path: str, **kwargs: Any) -> httpx.Response:
        if self._http is None:
            raise RuntimeError("VLLMBackend.start() was not called")
        response = self._http.post(path, **kwargs)
        if response.is_error:
            raise RuntimeError(f"vLLM {path} answered {response.status_code}: {response.text[:500]}")
        return response


def served_lora_rank(policy: Any) -> int:
    """The ``--max-lora-rank`` that serves ``policy``'s LoRA adapters: their largest rank (``r`` and any
    ``rank_pattern``), rounded up to one of :data:`LORA_RANKS`; :data:`DEFAULT_LORA_RANK` for a policy without
    adapters (not known yet)."""
    adapters = getattr(policy, "peft_config", None)
    if not adapters:
        return DEFAULT_LORA_RANK
    rank = max(max([int(config.r), *map(int, (config.rank_pattern or {}).values())]) for config in adapters.values())
    fitting = [allowed for allowed in LORA_RANKS if allowed >= rank]
    if not fitting:
        raise ValueError(f"VLLMBackend: LoRA rank {rank} is above vLLM's largest --max-lora-rank ({LORA_RANKS[-1]})")
    return fitting[0]


def _require_cuda(mode: str) -> None:
    import torch

    if not torch.cuda.is_available():
        raise VLLMUnavailable(
            f"VLLMBackend(sync={mode!r}) moves weights GPU to GPU and needs CUDA; without a GPU use sync='lora' "
            "(LoRA policy) or sync='disk' (full fine-tuning)"
        )


def _require_full_model(policy: Any, mode: str) -> None:
    if hasattr(policy, "peft_config"):
        raise ValueError(f"VLLMBackend(sync={mode!r}) pushes full weights; use sync='lora' for a LoRA policy")


def _stop_process_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server and the engine processes it spawned (its session); SIGKILL what is left after 30 s."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    except ProcessLookupError:
        return
    try:
        os.killpg(process.pid, signal.SIGKILL)  # whatever of the group is left (engine core, workers)
    except ProcessLookupError:
        pass
    process.wait(timeout=10)
