"""``python -m examples.spider.train --dry-run --policies``: the writer and the rewriter trained as two LoRA adapters,
the checker frozen; the LangChain agent's rollouts (mock model) go through the proxy, each role routed to its policy."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentlightning.server import SQLiteStore
from examples.common import policy_dry_run
from examples.spider.mock import mock_handler
from examples.spider.train import POLICIES, parser, training_plan

pytest.importorskip("peft")


def test_dry_run_trains_writer_and_rewriter_as_two_adapters_with_the_checker_frozen(
    data_dir: Path, tmp_path: Path
) -> None:
    plan = training_plan(parser().parse_args(["--data-dir", str(data_dir), "--dry-run", "--policies"]))
    tasks = plan["dataset"][:3]
    result = policy_dry_run(plan, mock_handler(tasks), tasks, POLICIES, tmp_path / "run", steps=1)
    (row,) = result.history
    assert row["policy/writer/model_version"] == "v1" and row["policy/rewriter/model_version"] == "v1"
    assert row["policy/writer/train/rows"] > 0 and row["policy/rewriter/train/rows"] > 0
    store = SQLiteStore(tmp_path / "run" / "store.db")
    try:
        calls = [call for info in store.list_rollouts() for call in store.get_rollout(info.rollout_id).llm_calls]
    finally:
        store.close()
    served = {(call.role, call.metadata.get("policy"), call.metadata.get("model_version")) for call in calls}
    assert served == {("writer", "writer", "v0"), ("rewriter", "rewriter", "v0"), ("checker", None, "base")}
