"""The web dashboard: one page (plain HTML/JS/CSS under ``static/``, no build step, nothing fetched from the
internet) at ``/ui/``, and the read-only JSON it draws under ``/ui/api/``, behind the server's bearer token.
``agl server`` serves it next to the API; ``agl dashboard RUN_DIR`` serves it alone over a run's files."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query
from fastapi.responses import FileResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

from agentlightning.server._errors import StrictJSONRoute
from agentlightning.server._runtime import Runtime
from agentlightning.server.store._browse import MAX_OFFSET, RolloutQuery, StoreReader

STATIC = Path(__file__).parent / "static"


def add_server_dashboard(app: FastAPI, runtime: Runtime, dependencies: Sequence[Any]) -> None:
    """The dashboard of a running server, over its store file and the ``metrics.jsonl`` beside it (where
    ``agl.train`` writes both)."""
    path = getattr(runtime.store, "path", None)
    metrics = Path(path).parent / "metrics.jsonl" if path and path != ":memory:" else None

    def settings() -> dict[str, Any]:
        upstream = runtime.upstream
        return {
            **dataclasses.asdict(runtime.settings),
            "upstream": upstream and upstream.url,
            "model_name": upstream and upstream.model_name,
            "token_required": bool(runtime.token),
        }

    add_dashboard(app, path, metrics, dependencies=dependencies, settings=settings)


def add_dashboard(
    app: FastAPI,
    store_path: str | Path | None,
    metrics_path: Path | None,
    *,
    dependencies: Sequence[Any] = (),
    settings: Callable[[], dict[str, Any]] = dict,
) -> None:
    """Serve the dashboard on ``app`` over the store file at ``store_path`` and ``metrics_path`` (either may be
    missing: the pages say so). The page itself carries no data; its API requires ``dependencies`` (the auth)."""
    reader = None
    if store_path is not None and str(store_path) != ":memory:" and Path(store_path).is_file():
        reader = StoreReader(store_path)
    app.include_router(_api(reader, metrics_path, settings), dependencies=list(dependencies))
    app.mount("/ui/static", StaticFiles(directory=STATIC), name="dashboard-static")

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse("/ui/")

    @app.get("/ui/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "dashboard.html")


def dashboard_app(run_dir: str | Path, token: str | None = None) -> FastAPI:
    """``agl dashboard RUN_DIR``: the dashboard alone, read-only, over ``RUN_DIR/store.db`` and
    ``RUN_DIR/metrics.jsonl`` (``RUN_DIR`` may also be a store file)."""
    from agentlightning.server._auth import bearer_token
    from agentlightning.server._errors import add_error_handlers

    run = Path(run_dir)
    store, metrics = (run, run.parent / "metrics.jsonl") if run.is_file() else (run / "store.db", run / "metrics.jsonl")
    if not (store.is_file() or metrics.is_file()):
        raise FileNotFoundError(
            f"{run_dir}: neither a store (store.db) nor metrics.jsonl there; is it a run directory?"
        )
    app = FastAPI(title="Agent Lightning dashboard")
    add_error_handlers(app)
    add_dashboard(
        app,
        store,
        metrics,
        dependencies=[Depends(bearer_token(token))] if token else [],
        settings=lambda: {"run": str(run.resolve()), "read_only": True},
    )
    return app


def read_metrics(path: Path | None, since: int = 0) -> tuple[int, list[dict[str, Any]]]:
    """How many rows a metrics file has, and those from row ``since`` on (only they are parsed: a long run's poll
    stays cheap). A last line the run is still writing waits for the next read."""
    text = path.read_text(encoding="utf-8") if path is not None and path.is_file() else ""
    lines = [line for line in text[: text.rfind("\n") + 1].splitlines() if line.strip()]
    return len(lines), [json.loads(line) for line in lines[max(0, since) :]]


EVAL_DIR = "eval"
"""Where ``agl.evaluate`` writes the reports of a run's model (``<run>/eval/<name>.json``)."""
EVAL_FIELDS = (
    "name",
    "model",
    "model_version",
    "rollouts",
    "tasks",
    "accuracy",
    "reward",
    "tool_error_rate",
    "created",
)


def read_evals(directory: Path | None) -> list[dict[str, Any]]:
    """The headline fields of every evaluation report in ``directory``, newest first; a file that is not one is
    listed with the reason."""
    if directory is None or not directory.is_dir():
        return []
    found = []
    for path in directory.glob("*.json"):
        try:
            report = json.loads(path.read_text(encoding="utf-8"))
            found.append({"file": path.name, **{key: report[key] for key in EVAL_FIELDS}})
        except (ValueError, KeyError, TypeError) as exc:
            found.append({"file": path.name, "error": f"not an evaluation report: {exc!r}"})
    return sorted(found, key=lambda entry: entry.get("created") or 0, reverse=True)


def _api(reader: StoreReader | None, metrics_path: Path | None, settings: Callable[[], dict[str, Any]]) -> APIRouter:
    routes = APIRouter(prefix="/ui/api", route_class=StrictJSONRoute, tags=["dashboard"])

    def store() -> StoreReader:
        if reader is None:
            raise HTTPException(
                404,
                "this run has no store file (rollouts are kept only with a server's SQLite "
                "store: agl.train(use_server=True), agl server --store FILE)",
            )
        return reader

    # Plain functions: FastAPI runs them on its thread pool, so a query never holds up the server's event loop.
    @routes.get("/overview")
    def overview() -> dict[str, Any]:
        return {
            "settings": settings(),
            "store": reader and str(reader.path),
            "metrics": str(metrics_path),
            **(reader.overview() if reader else {}),
        }

    @routes.get("/batches")
    def batches() -> list[dict[str, Any]]:
        return store().batches()

    @routes.get("/filters")
    def filters() -> dict[str, list[str]]:
        return store().filter_options()

    @routes.get("/metrics")
    def metrics(since: int = 0) -> dict[str, Any]:
        total, rows = read_metrics(metrics_path, since)
        return {"total": total, "rows": rows}

    @routes.get("/evals")
    def evals() -> list[dict[str, Any]]:
        return read_evals(metrics_path.parent / EVAL_DIR if metrics_path is not None else None)

    @routes.get("/rollouts")
    def rollouts(query: Annotated[RolloutQuery, Query()]) -> dict[str, Any]:
        return store().rollouts(query)

    @routes.get("/rollouts/{rollout_id}")
    def rollout(rollout_id: str) -> dict[str, Any]:
        return store().rollout(rollout_id)

    @routes.get("/tasks")
    def tasks(
        sort: Literal["task", "rollouts", "reward", "last"] = "last",
        desc: bool = True,
        limit: Annotated[int, Query(le=MAX_OFFSET)] = 50,
        offset: Annotated[int, Query(le=MAX_OFFSET)] = 0,
    ) -> dict[str, Any]:
        return store().tasks(sort=sort, descending=desc, limit=max(1, min(limit, 500)), offset=max(0, offset))

    @routes.get("/tasks/{task_id:path}")
    def task(
        task_id: str, limit: Annotated[int, Query(le=MAX_OFFSET)] = 20, offset: Annotated[int, Query(le=MAX_OFFSET)] = 0
    ) -> dict[str, Any]:
        return store().task_groups(task_id, limit=max(1, min(limit, 200)), offset=max(0, offset))

    return routes
