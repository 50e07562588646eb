"""The ``agl`` command: ``agl server``, ``agl client``, ``agl train``, ``agl eval``, ``agl sft``, ``agl rollouts
list|show``, ``agl dashboard``.

The training options of ``agl train`` and ``agl server --model`` are the fields of ``TrainConfig``, one flag each
(``agentlightning.trainers._arguments``); ``agl server --model NAME`` hands over to
``agentlightning.trainers.serve.serve_training(server, args)``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib.metadata
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from agentlightning._cli_eval import eval_arguments, run_eval, run_sft, sft_arguments
from agentlightning._signals import Stopped

logger = logging.getLogger("agl")

DISTRIBUTION = "agentlightning-rl"
"""The name this project is installed under (the import name is ``agentlightning``)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``agl`` console script."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--log-level", default=os.environ.get("AGL_LOG_LEVEL", "INFO"), help="logging level")
    remote = argparse.ArgumentParser(add_help=False, parents=[common])  # options of the commands that ask a server
    remote.add_argument("--server-url", help="default $AGL_SERVER_URL (or $AgentLightningServerUrl)")
    remote.add_argument("--token", help="default $AGL_SERVER_TOKEN")
    source = argparse.ArgumentParser(add_help=False, parents=[remote])
    source.add_argument(
        "--store", help="read this SQLite store (or a run directory's store.db) directly instead of asking a server"
    )
    parser = argparse.ArgumentParser(prog="agl", description="Agent Lightning: train the LLM inside any agent.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {importlib.metadata.version(DISTRIBUTION)}")
    commands = parser.add_subparsers(dest="command", required=True)
    shown: dict[str, Any] = {"formatter_class": argparse.ArgumentDefaultsHelpFormatter}
    add_server_arguments(commands.add_parser("server", parents=[common], help="run the Lightning Server", **shown))
    _client_arguments(commands.add_parser("client", parents=[remote], help="serve rollouts of an agent", **shown))
    _train_arguments(commands.add_parser("train", parents=[common], help="train the LLM inside an agent", **shown))
    eval_arguments(commands.add_parser("eval", parents=[common], help="score an agent against a model", **shown))
    sft_arguments(
        commands.add_parser("sft", parents=[common], help="fine-tune on a run's successful rollouts", **shown)
    )
    rollouts = commands.add_parser("rollouts", help="inspect rollouts").add_subparsers(dest="action", required=True)
    listing = rollouts.add_parser("list", parents=[source], help="list rollouts, newest first", **shown)
    listing.add_argument("--status", help="only this state (queued, running, succeeded, failed, timeout, cancelled)")
    listing.add_argument("--task-id")
    listing.add_argument("--group-id")
    listing.add_argument("--dataset-id")
    listing.add_argument("--limit", type=int, default=20, help="most rollouts listed")
    listing.add_argument("--json", action="store_true", help="print JSON lines")
    show = rollouts.add_parser("show", parents=[source], help="show one rollout in detail", **shown)
    show.add_argument("rollout_id")
    show.add_argument("--tokens", action="store_true", help="print the token ids of every LLM call")
    show.add_argument("--json", action="store_true", help="print the rollout as JSON")
    dashboard = commands.add_parser("dashboard", parents=[common], help="serve a run's dashboard, read-only", **shown)
    dashboard.add_argument("run_dir", help="a run's output directory (store.db, metrics.jsonl) or a store file")
    dashboard.add_argument("--host", default="127.0.0.1", help="interface to bind (beyond loopback needs --token)")
    dashboard.add_argument("--port", type=int, default=4748, help="port to listen on")
    dashboard.add_argument("--token", default=os.environ.get("AGL_SERVER_TOKEN"), help="bearer token the page asks for")

    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _quiet_request_logs()
    training = args.command == "server" and args.model
    handlers = {
        "server": _serve,
        "client": _client,
        "train": _train,
        "eval": run_eval,
        "sft": run_sft,
        "dashboard": _dashboard,
        "rollouts": _rollouts,
    }
    try:
        return _serve_training(args) if training else handlers[args.command](args)
    except Stopped as stopped:  # SIGTERM or SIGHUP in agl train or agl server --model, after its clean-up
        print(f"agl {args.command}: {stopped}", file=sys.stderr)
        return stopped.exit_code
    except (ValueError, TypeError, FileNotFoundError, RuntimeError) as exc:
        print(f"agl {args.command}: error: {exc}", file=sys.stderr)
        return 2


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``agl server``, and the training options it takes with ``--model`` (``serve_training``)."""
    from agentlightning.trainers._arguments import add_train_arguments

    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (beyond loopback needs --token)")
    parser.add_argument("--port", type=int, default=4747, help="port to listen on (0: a free one)")
    parser.add_argument("--store", default="agl-store.db", help="SQLite file (reopening it resumes)")
    parser.add_argument(
        "--token",
        default=os.environ.get("AGL_SERVER_TOKEN"),
        help="bearer token clients must send (default $AGL_SERVER_TOKEN)",
    )
    parser.add_argument("--upstream", help="OpenAI-compatible base URL the proxy forwards to, e.g. http://h:8000/v1")
    parser.add_argument("--model-name", help="model name to request upstream")
    parser.add_argument("--model-version", help="version stamped on recorded calls (default: the model name)")
    parser.add_argument(
        "--upstream-api-key",
        default=os.environ.get("AGL_UPSTREAM_API_KEY"),
        help="API key sent to the upstream (default $AGL_UPSTREAM_API_KEY)",
    )
    parser.add_argument("--logprobs", action="store_true", help="ask the upstream for sampling logprobs")
    parser.add_argument(
        "--translate-responses",
        action="store_true",
        help="send Responses API requests (Codex) upstream as chat completions, for a chat-only upstream",
    )
    parser.add_argument("--lease", type=float, default=30.0, help="seconds a worker may go without a heartbeat")
    parser.add_argument("--timeout", type=float, default=600.0, help="default seconds per rollout")
    parser.add_argument("--max-attempts", type=int, default=3, help="attempts per rollout (retries + 1)")
    parser.add_argument("--max-body-mb", type=float, default=64.0, help="largest request body accepted")
    parser.add_argument(
        "--max-prompt-mb",
        type=float,
        default=4.0,
        help="most text in one proxied LLM request, in MiB (image and audio data not counted); more gets a 413",
    )
    parser.add_argument(
        "--upstream-retry-window",
        type=float,
        default=120.0,
        help="seconds the proxy retries an upstream that is down or answers 429/5xx",
    )
    parser.add_argument(
        "--late-answer-grace",
        type=float,
        default=30.0,
        help="seconds the proxy still awaits an upstream answer once its agent left or its attempt ended",
    )
    parser.add_argument(
        "--requeue-delay",
        type=float,
        default=2.0,
        help="seconds before a failed attempt is leased again (doubling per attempt, up to 60)",
    )
    parser.add_argument("--public-url", help="URL clients reach this server at (None: http://host:port)")
    parser.add_argument(
        "--collect",
        type=int,
        metavar="K",
        default=0,
        help="when a client attaches a dataset, run K rollouts per task, then stop everyone",
    )
    parser.add_argument(
        "--model", help="train this model on the rollouts clients run (the training options below apply)"
    )
    parser.add_argument(
        "--val-fraction", type=float, default=0.0, help="with --model: hold out this share of the attached dataset"
    )
    # the server's --timeout is the rollout timeout; its workers are the remote clients
    add_train_arguments(parser, exclude={"model", "use_server", "nworkers", "workers", "rollout_timeout"})


def server_from_args(args: argparse.Namespace) -> Any:
    """A :class:`LightningServer` configured from ``agl server`` options (not started)."""
    from agentlightning.server import LightningServer, Settings

    settings = Settings(
        lease_seconds=args.lease,
        rollout_timeout=args.timeout,
        max_attempts=args.max_attempts,
        max_body_bytes=int(args.max_body_mb * 1024 * 1024),
        max_prompt_bytes=int(args.max_prompt_mb * 1024 * 1024),
        upstream_retry_window=args.upstream_retry_window,
        late_answer_grace=args.late_answer_grace,
        requeue_delay=args.requeue_delay,
    )
    return LightningServer(
        args.store,
        upstream_url=args.upstream,
        host=args.host,
        port=args.port,
        token=args.token,
        model_name=args.model_name,
        model_version=args.model_version,
        upstream_api_key=args.upstream_api_key,
        logprobs=args.logprobs,
        translate_responses=args.translate_responses,
        settings=settings,
        public_url=args.public_url,
    )


def _quiet_request_logs() -> None:
    """One INFO line per HTTP request (httpx's, uvicorn's access log) only at ``--log-level DEBUG``: at INFO they
    would bury the run's own lines and its progress bar."""
    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        for name in ("httpx", "httpcore", "uvicorn.access"):
            logging.getLogger(name).setLevel(logging.WARNING)


def _serve_training(args: argparse.Namespace) -> int:
    try:
        from agentlightning.trainers.serve import serve_training, training_config
    except ImportError as exc:
        raise RuntimeError(
            f"agl server --model needs the training extra: pip install 'agentlightning-rl[train]' ({exc})"
        ) from None
    training_config(args)  # a bad training option fails before the server creates its store
    return serve_training(server_from_args(args), args)


def _serve(args: argparse.Namespace) -> int:
    server = server_from_args(args).start()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(f"Lightning server on {server.url} (store {args.store}; dashboard at /ui/); Ctrl-C stops", flush=True)
    try:
        if args.collect:
            _collect(server, args.collect, stop)
        stop.wait()
    finally:
        server.stop()
    return 0


def _collect(server: Any, group_size: int, stop: threading.Event) -> None:
    """Run ``group_size`` rollouts per task of the first dataset a client attaches, then tell clients to stop."""
    dataset_id = None
    while dataset_id is None and not stop.is_set():
        dataset_id = server.wait_for_dataset(timeout=0.5)
    if dataset_id is None:
        return
    ids = server.enqueue(dataset_id, group_size=group_size)
    logger.info("collecting %d rollouts of dataset %s", len(ids), dataset_id)
    while not stop.is_set():
        try:
            rollouts = server.wait(ids, timeout=1.0)
        except TimeoutError:
            continue
        counts = dict(collections.Counter(rollout.status for rollout in rollouts))
        logger.info("all %d rollouts finished: %s; telling clients to stop", len(ids), counts)
        server.request_stop()
        stop.wait(3.0)  # clients poll at least every few seconds
        stop.set()


CLIENT_RECONNECT_SECONDS = 10.0
"""``agl client``'s wait for a server that went away: long enough for a restart on the same port, short enough that
a client whose server is gone says so and exits (the Python API's ``reconnect_seconds`` waits 10 minutes)."""


def _client_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--agent", required=True, help="the agent as 'package.module:function'")
    parser.add_argument("--dataset", help="JSONL or JSON file of tasks (uploaded if the server lacks it)")
    parser.add_argument("--dataset-id", help="id of a dataset already on the server")
    parser.add_argument("--nworkers", type=int, default=-1, help="worker processes (-1: one per core)")
    parser.add_argument("--timeout", type=float, help="seconds per rollout (default: the server's)")
    parser.add_argument(
        "--reconnect-seconds",
        type=float,
        default=CLIENT_RECONNECT_SECONDS,
        help="how long the workers wait for a server that stopped answering (a restart) before the client exits 2",
    )
    parser.add_argument(
        "--ray",
        nargs="?",
        const="",
        metavar="ADDRESS",
        help="run the workers as Ray actors on the cluster at ADDRESS (auto, ray://head:10001; "
        "default $RAY_ADDRESS, else a local cluster); --nworkers -1: as many as its CPUs allow",
    )
    parser.add_argument("--cpus-per-worker", type=float, default=1.0, help="CPUs each Ray worker reserves")
    parser.add_argument(
        "--runtime-env-json",
        type=json.loads,
        metavar="JSON",
        help='Ray runtime environment of the workers, e.g. \'{"working_dir": "."}\' to ship the agent',
    )


def _client(args: argparse.Namespace) -> int:
    from agentlightning.client import Client, RayWorkers  # RayWorkers imports Ray once they start

    sys.path.insert(0, os.getcwd())  # agents named relative to the working directory, as `python -m` would
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM drains like Ctrl-C (a second one kills)
    workers = (
        None
        if args.ray is None
        else RayWorkers(args.ray or None, args.nworkers, args.cpus_per_worker, runtime_env=args.runtime_env_json)
    )
    Client(args.server_url, token=args.token).train(
        args.agent,
        dataset=args.dataset,
        dataset_id=args.dataset_id,
        nworkers=args.nworkers,
        timeout=args.timeout,
        workers=workers,
        log_level=logging.getLogger().level,
        reconnect_seconds=args.reconnect_seconds,
    )
    return 0


def _train_arguments(parser: argparse.ArgumentParser) -> None:
    from agentlightning.trainers._arguments import add_train_arguments

    parser.add_argument("agent", nargs="?", help="the agent as 'package.module:function' (or give --command)")
    parser.add_argument(
        "--command",
        dest="command_line",
        help='train a command-line agent instead: the command each rollout runs, e.g. "python agent.py {task[q]}" '
        "(agl.CommandAgent: the rollout's OPENAI_/ANTHROPIC_BASE_URL in its environment, reward its last stdout line)",
    )
    parser.add_argument(
        "--isolated",
        action="store_true",
        help="run the --command under bubblewrap: read-only file system but for its rollout's directories, "
        "its own processes (agl.CommandAgent(isolated=True))",
    )
    parser.add_argument("--dataset", required=True, help="JSONL or JSON file of training tasks")
    parser.add_argument("--val-dataset", help="JSONL or JSON file of held-out tasks")
    add_train_arguments(parser)


def _train(args: argparse.Namespace) -> int:
    from agentlightning._command import command_line_agent
    from agentlightning.client._client import load_records
    from agentlightning.client._worker import load_agent
    from agentlightning.trainers import train
    from agentlightning.trainers._arguments import options_from_args
    from agentlightning.trainers.config import NothingTrainedError, TrainConfig

    if (args.agent is None) == (args.command_line is None):
        raise ValueError("give the agent as 'package.module:function' or a --command, one of them")
    if args.isolated and args.command_line is None:
        raise ValueError("--isolated applies to a --command agent (for an agl.CommandAgent: isolated=True)")
    sys.path.insert(0, os.getcwd())  # agents named relative to the working directory, as `python -m` would
    config = TrainConfig.from_options(None, options_from_args(args))
    val = load_records(args.val_dataset) if args.val_dataset else None
    if args.command_line is None:
        agent = load_agent(args.agent)
    else:
        agent = command_line_agent(args.command_line, isolated=args.isolated)
    try:
        result = train(agent, load_records(args.dataset), val_dataset=val, config=config)
    except ModuleNotFoundError as exc:
        raise RuntimeError(
            f"agl train needs the training extra: pip install 'agentlightning-rl[train]' ({exc})"
        ) from None
    except NothingTrainedError as exc:
        print(exc.result.summary(), flush=True)
        print(f"agl train: error: {exc}", file=sys.stderr)
        return 1
    print(result.summary(), flush=True)
    return 0


def _dashboard(args: argparse.Namespace) -> int:
    from agentlightning._uvicorn import BackgroundServer
    from agentlightning.server._auth import check_bind
    from agentlightning.server._dashboard import dashboard_app

    check_bind(args.host, args.token)
    app = dashboard_app(args.run_dir, args.token)
    server = BackgroundServer(app, args.host, args.port, name="agl dashboard").start()  # its URL once it listens
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(f"dashboard of {args.run_dir} on {server.url}/ui/ (read-only); Ctrl-C stops", flush=True)
    try:
        stop.wait()
    finally:
        server.stop()
    return 0


def _rollouts(args: argparse.Namespace) -> int:
    if args.action == "list":
        rows = _list(args)
        if args.json:
            for row in rows:
                print(json.dumps(row))
        else:
            _print_table(rows)
        return 0
    rollout, attempts = _show(args)
    if args.json:
        print(json.dumps({**rollout, "attempts": attempts}, indent=2))
    else:
        _print_rollout(rollout, attempts, args.tokens)
    return 0


def _list(args: argparse.Namespace) -> list[dict[str, Any]]:
    filters = {"status": args.status, "task_id": args.task_id, "group_id": args.group_id, "dataset_id": args.dataset_id}
    if args.store:
        with _open_store(args.store) as store:
            return [row.model_dump() for row in store.list_rollouts(**filters, limit=args.limit)]
    params = {key: value for key, value in filters.items() if value is not None} | {"limit": args.limit}
    return _api(args).request("GET", "/rollouts", params=params, retry_for=5.0)


def _show(args: argparse.Namespace) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    if args.store:
        with _open_store(args.store) as store:
            rollout = store.get_rollout(args.rollout_id)
            if rollout is None:
                raise ValueError(f"no rollout {args.rollout_id!r} in {args.store}")
            return rollout.model_dump(mode="json"), [a.model_dump(mode="json") for a in store.attempts(args.rollout_id)]
    from agentlightning.protocol import ServerError

    api = _api(args)
    try:
        return (
            api.request("GET", f"/rollouts/{args.rollout_id}", retry_for=5.0),
            api.request("GET", f"/rollouts/{args.rollout_id}/attempts", retry_for=5.0),
        )
    except ServerError as exc:
        raise ValueError(exc.message) from None


def _open_store(path: str) -> Any:
    """The store file ``path``, or a run directory's ``store.db`` (as ``agl dashboard RUN_DIR`` takes)."""
    from agentlightning.server.store import SQLiteStore

    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "store.db")):
            raise FileNotFoundError(f"--store {path!r} is a directory without a store.db; is it a run directory?")
        path = os.path.join(path, "store.db")
    elif not os.path.exists(path):
        raise FileNotFoundError(f"store file {path!r} does not exist")
    return contextlib.closing(SQLiteStore(path))


def _api(args: argparse.Namespace) -> Any:
    from agentlightning.client._api import ServerAPI, resolve_token

    return ServerAPI(args.server_url, resolve_token(args.token))


def _print_table(rows: list[dict[str, Any]]) -> None:
    print(f"{'ROLLOUT':<22} {'STATUS':<10} {'TRY':>3} {'TASK':<18} {'REWARD':>7} {'CALLS':>5} {'MODEL':<12} ENDED")
    for row in rows:
        reward = "" if row["final_reward"] is None else f"{row['final_reward']:.3g}"
        ended = time.strftime("%H:%M:%S", time.localtime(row["ended"])) if row["ended"] else ""
        print(
            f"{row['rollout_id']:<22} {row['status']:<10} {row['attempt']:>3} {str(row['task_id'])[:18]:<18} "
            f"{reward:>7} {row['n_calls'] if row['n_calls'] is not None else '':>5} "
            f"{str(row['model_version'] or '')[:12]:<12} {ended}"
        )


def _print_rollout(rollout: dict[str, Any], attempts: list[dict[str, Any]], tokens: bool) -> None:
    print(
        f"rollout {rollout['rollout_id']}  status={rollout['status']}  attempt={rollout['attempt']}  "
        f"task={rollout['task_id']}  group={rollout['group_id']}  model={rollout['model_version']}"
    )
    print(f"task: {json.dumps(rollout['task'])[:200]}")
    print(f"final reward: {rollout['final_reward']}")
    if rollout.get("error"):
        print(f"error: {rollout['error']['type']}: {rollout['error']['message']}")
    for call in rollout["calls"]:
        prompt, completion = call.get("prompt_token_ids"), call.get("completion_token_ids")
        output = call.get("output") or {}
        content = output.get("content") if isinstance(output, dict) else output
        print(
            f"  [{call['sequence']}] {call['kind']} role={call['role']} name={call['name']} status={call['status']} "
            f"tokens={len(prompt or [])}+{len(completion or [])} source={call['token_source']}"
        )
        if content:
            print(f"      -> {str(content)[:160]!r}")
        if tokens:
            print(f"      prompt_token_ids={prompt}")
            print(f"      completion_token_ids={completion}")
    for reward in rollout["rewards"]:
        print(f"  reward {reward['value']} source={reward['source']} call={reward['call_id']}")
    for attempt in attempts:
        error = attempt.get("error") or {}
        print(
            f"  attempt {attempt['attempt']}: {attempt['status']} worker={attempt['worker_id']}"
            + (f" error={error.get('type')}: {error.get('message')}" if error else "")
        )
    for line in rollout.get("logs", [])[-20:]:
        print(f"  log: {line}")


if __name__ == "__main__":
    sys.exit(main())
