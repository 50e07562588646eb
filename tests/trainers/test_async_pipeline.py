"""The rollout pipeline of asynchronous training, driven by real agents (threads) against the mock OpenAI server,
and the importance-sampling weights, checked by hand."""

from __future__ import annotations

import math

import pytest
import torch
from agentlightning.trainers._pipeline import RolloutPipeline, fresh_enough, version_number
from agentlightning.trainers.config import TrainConfig
from agentlightning.trainers.learner._importance import importance_weights
from agentlightning.trainers.rollouts import LocalRollouts, RolloutProgress, ServerRollouts
from async_agents import scored_agent

from agentlightning.server import SQLiteStore
from agentlightning.testing import MockLLMServer
from agentlightning.types import Transition


@pytest.fixture
def mock_source():
    with MockLLMServer(token_ids=True) as server:
        source = LocalRollouts(scored_agent, nworkers=8)
        source.set_model(server.base_url, "mock-model", "v0")
        yield source, server
        source.close()


def _pipeline(source, dataset, *, staleness, refills, tasks_per_step=2, backlog=(), algorithm="grpo"):
    order = iter(range(10_000))
    return RolloutPipeline(
        source,
        dataset,
        lambda count: [next(order) % len(dataset) for _ in range(count)],
        tasks_per_step=tasks_per_step,
        group_size=3,
        max_staleness=staleness,
        refill_cap=refills,
        timeout=30,
        roles=None,
        credit="identical",
        air=None,
        algorithm=algorithm,
        backlog=backlog,
    )


def _tasks(flat):
    return [{"id": f"t{i}", "question": f"question {i}", "flat": is_flat} for i, is_flat in enumerate(flat)]


def test_versions_and_the_staleness_bound_by_hand():
    assert [version_number(v) for v in ("v0", "v12", "policy", None, "vx")] == [0, 12, None, None, None]
    rows = [
        Transition(rollout_id=f"r{v}", index=0, prompt_token_ids=[1], completion_token_ids=[2], model_version=f"v{v}")
        for v in range(4)
    ]
    kept, lags = fresh_enough(rows, trained_version=3, max_staleness=1)
    assert [row.model_version for row in kept] == ["v2", "v3"] and lags == [1, 0]
    assert fresh_enough(rows, 3, 0)[0] == rows[3:]


@pytest.mark.parametrize("refills", [0, 1], ids=["no-dynamic-sampling", "dynamic-sampling"])
def test_a_transition_older_than_max_staleness_is_never_trained_on(mock_source, refills):
    source, _ = mock_source
    pipeline = _pipeline(source, _tasks([False] * 8), staleness=1, refills=refills)
    first = pipeline.next_step(0, trained_version=0)
    assert first.metrics["async/groups_used"] == 2 and first.metrics["async/queue_depth"] == 2  # one step ahead
    assert {row.model_version for row in first.transitions} == {"v0"}
    pipeline.drain()  # the two groups sampled ahead by v0 have finished
    source.set_model(source.llm.base_url, "mock-model", "v2")  # two updates later
    second = pipeline.next_step(1, trained_version=2)
    assert second.metrics["async/dropped_stale"] == 6  # the two v0 groups (3 transitions each), lag 2 > 1
    assert second.metrics["async/dropped_stale_total"] == 6
    if refills:  # the stale groups are set aside and the fresh ones, already running, take their place
        assert second.transitions and {row.model_version for row in second.transitions} == {"v2"}
        assert second.metrics["async/groups_without_signal"] == 2 and second.metrics["async/staleness_max"] == 0
    else:  # the step takes the oldest groups; their stale transitions are dropped, never trained on
        assert second.transitions == [] and second.metrics["async/groups_used"] == 2
    pipeline.close()


def test_a_step_takes_its_groups_in_submission_order_not_as_they_finish(mock_source):
    """The first group's environment is slow: the step waits for it while the younger groups finish (a batch of the
    groups that finish first would favour quick rollouts: short answers, fewer tool calls)."""
    source, _ = mock_source
    tasks = _tasks([False] * 4)
    tasks[0]["delay"] = 1.0
    pipeline = _pipeline(source, tasks, staleness=1, refills=0)
    step = pipeline.next_step(0, trained_version=0)
    assert {row.task_id for row in step.transitions} == {"t0", "t1"}
    assert pipeline.pending_indices() == [2, 3]
    pipeline.close()


def test_a_group_without_reward_variance_is_refilled_with_a_new_task(mock_source):
    source, server = mock_source
    dataset = _tasks([True, False, False, False])
    pipeline = _pipeline(source, dataset, staleness=0, refills=2)
    step = pipeline.next_step(0, trained_version=0)
    assert step.metrics["async/groups_without_signal"] == 1 and step.metrics["async/refills"] == 1
    assert step.metrics["async/groups_used"] == 2
    used_tasks = {row.task_id for row in step.transitions}
    assert used_tasks == {"t1", "t2"}, "the flat group t0 is replaced by the next task, t2"
    assert len({row.group_id for row in step.transitions}) == 2
    assert len(step.rollouts) == 9  # the flat group still shows in the step's reward metrics
    assert len(server.requests) == 9 and not pipeline.pending


@pytest.mark.parametrize("algorithm", ["reinforce++_baseline", "reinforce++"])
def test_a_group_that_ties_is_refilled_only_under_an_estimator_centred_per_group(mock_source, algorithm):
    """reinforce++_baseline centres on the group's mean like GRPO (a tied group has zero advantages);
    reinforce++'s batch baseline gives the tied group a signal against the other groups, so it is trained on."""
    source, _ = mock_source
    pipeline = _pipeline(source, _tasks([True, False, False, False]), staleness=0, refills=2, algorithm=algorithm)
    step = pipeline.next_step(0, trained_version=0)
    used_tasks = {row.task_id for row in step.transitions}
    if algorithm == "reinforce++":
        assert used_tasks == {"t0", "t1"} and step.metrics["async/refills"] == 0
    else:
        assert used_tasks == {"t1", "t2"} and step.metrics["async/refills"] == 1
    pipeline.close()


def test_a_group_set_aside_is_replaced_at_once_so_the_step_ahead_keeps_its_groups(mock_source):
    source, _ = mock_source
    pipeline = _pipeline(source, _tasks([True, True, True] + [False] * 7), staleness=1, refills=4)
    step = pipeline.next_step(0, trained_version=0)  # 4 groups: t0-t2 flat, t3; each flat one seen is replaced
    assert step.metrics["async/groups_used"] == 2
    assert step.metrics["async/refills"] == step.metrics["async/groups_without_signal"] >= 2
    assert step.metrics["async/queue_depth"] == 2, "the next step's two groups are still in flight"


def test_refills_stop_at_the_cap(mock_source):
    source, _ = mock_source
    pipeline = _pipeline(source, _tasks([True] * 6), staleness=0, refills=3)
    step = pipeline.next_step(0, trained_version=0)
    assert step.metrics["async/refills"] == 3 and step.metrics["async/groups_without_signal"] == 5
    assert step.transitions == [] and step.metrics["async/groups_used"] == 0


def test_max_staleness_zero_without_refills_is_the_synchronous_step(mock_source):
    source, server = mock_source
    pipeline = _pipeline(source, _tasks([True, False]), staleness=0, refills=0)
    step = pipeline.next_step(0, trained_version=0)
    # every group is used (the flat one is dropped later by pack, as before), nothing runs ahead
    assert step.metrics["async/groups_used"] == 2 and not pipeline.pending and len(server.requests) == 6
    assert len(step.transitions) == 6


def test_backlog_runs_first(mock_source):
    source, _ = mock_source
    pipeline = _pipeline(source, _tasks([False] * 6), staleness=1, refills=0, backlog=[5, 4])
    step = pipeline.next_step(0, trained_version=0)
    assert sorted(pipeline.pending_indices() + [int(r.task_id[1:]) for r in step.rollouts[::3]]) == [0, 1, 4, 5]


def test_rollouts_left_ahead_are_cancelled_when_the_source_closes(tmp_path):
    with MockLLMServer(token_ids=True) as server:
        source = ServerRollouts(scored_agent, tmp_path / "store.db", 1, rollout_timeout=30)
        try:
            source.set_model(server.base_url, "mock-model", "v0")
            source.submit(_tasks([False] * 5), 4, "step0", timeout=30)
        finally:
            source.close()
    store = SQLiteStore(tmp_path / "store.db")
    try:
        statuses = [info.status for info in store.list_rollouts(limit=100)]
    finally:
        store.close()
    assert len(statuses) == 20 and "cancelled" in statuses
    assert not set(statuses) & {"queued", "running"}, "a resumed run's workers must not pick them up"


def test_config_resolves_dynamic_sampling_and_rejects_bad_values():
    assert TrainConfig().refill_cap == 0
    assert TrainConfig(max_staleness=2, tasks_per_step=3).refill_cap == 3
    assert TrainConfig(max_staleness=2, dynamic_sampling=0).refill_cap == 0
    for bad in ({"max_staleness": -1}, {"max_staleness": 1.5}, {"dynamic_sampling": -2}, {"max_staleness": None}):
        with pytest.raises(ValueError, match="max_staleness|dynamic_sampling"):
            TrainConfig(**bad)


# -- importance sampling, by hand -----------------------------------------------------------------------------

TRAINED = torch.log(torch.tensor([[0.5, 0.2, 0.9]]))
SAMPLED = torch.log(torch.tensor([[0.25, 0.4, 0.1]]))
MASK = torch.tensor([[1, 1, 0]])  # the third token is padding


def test_token_truncated_importance_weights():
    ratio, stats = importance_weights(TRAINED, SAMPLED, MASK, "token_truncate", None, 1.5)
    assert torch.allclose(ratio, torch.tensor([[1.5, 0.5, 1.0]]))  # 2.0 truncated to 1.5; padding: exp(0)
    assert stats["sampling/raw_ratio/mean"] == pytest.approx(1.25)
    assert (stats["sampling/raw_ratio/min"], stats["sampling/raw_ratio/max"]) == pytest.approx((0.5, 2.0))
    assert (stats["sampling/truncated_tokens"], stats["sampling/masked_tokens"]) == (1, 0)


def test_token_masked_importance_weights():
    ratio, stats = importance_weights(TRAINED, SAMPLED, MASK, "token_mask", 0.6, 3.0)
    assert torch.allclose(ratio, torch.tensor([[2.0, 0.0, 1.0]]))  # 0.5 < 0.6: masked
    assert (stats["sampling/truncated_tokens"], stats["sampling/masked_tokens"]) == (0, 1)


def test_sequence_importance_weights():
    ratio, stats = importance_weights(TRAINED, SAMPLED, MASK, "sequence_truncate", None, 0.9)
    assert ratio.shape == (1, 1) and float(ratio) == pytest.approx(0.9)  # 2.0 * 0.5 = 1.0, truncated to 0.9
    assert stats["sampling/truncated_tokens"] == 2
    ratio, stats = importance_weights(TRAINED, SAMPLED, MASK, "sequence_mask", 0.5, 3.0)
    assert float(ratio) == pytest.approx(1.0) and stats["sampling/masked_tokens"] == 0
    sampled = torch.stack([SAMPLED[0], TRAINED[0] - math.log(4)])
    two = importance_weights(TRAINED.repeat(2, 1), sampled, MASK.repeat(2, 1), "sequence_mask", None, 3.0)
    assert torch.allclose(two[0], torch.tensor([[1.0], [0.0]]))  # the second sequence: 4 * 4 = 16 > 3, masked
    assert two[1]["sampling/masked_tokens"] == 2
    with pytest.raises(ValueError, match="mode"):
        importance_weights(TRAINED, SAMPLED, MASK, "tokens", None, None)


def test_queued_rollouts_are_not_hung_the_group_wait_counts_from_their_start(tmp_path):
    """Issue 35: ``agl server --model`` + 2 workers died with "5 of 8 rollouts unfinished after 600 s" although
    they were only queued. Here one worker runs 3 groups of 4 rollouts of 1.2 s each (about 15 s) under a 2 s
    rollout timeout: every group waits far longer than that in the queue, and none times out."""
    tasks = [{"id": f"t{i}", "question": f"q{i}", "delay": 1.2} for i in range(3)]
    with MockLLMServer(token_ids=True) as server:
        source = ServerRollouts(scored_agent, tmp_path / "store.db", 1, rollout_timeout=2.0)
        try:
            source.set_model(server.base_url, "mock-model", "v0")
            groups = source.submit(tasks, 4, "step0", timeout=2.0)
            rollouts = [rollout for group in groups for rollout in group.result(timeout=120)]
        finally:
            source.close()
    assert len(rollouts) == 12 and {rollout.status for rollout in rollouts} == {"succeeded"}


def test_a_slow_step_logs_where_its_rollouts_stand(caplog) -> None:
    """Issue 35, item 4: a step waiting for its rollouts logs, at INFO, how many finished, run and wait, and the
    completion tokens per second (LocalRollouts counts them from the finished rollouts' calls)."""
    with MockLLMServer(token_ids=True) as server:
        source = LocalRollouts(scored_agent, nworkers=2)  # 6 rollouts of 0.6 s, two at a time: about 2 s
        source.set_model(server.base_url, "mock-model", "v0")
        try:
            pipeline = _pipeline(source, [{"id": "t0", "question": "q", "delay": 0.6}] * 2, staleness=0, refills=0)
            pipeline.progress_seconds = 0.25
            with caplog.at_level("INFO", logger="agentlightning.trainers._pipeline"):
                step = pipeline.next_step(0, 0)
        finally:
            source.close()
    assert len(step.rollouts) == 6
    lines = [r.getMessage() for r in caplog.records if r.levelname == "INFO" and "rollouts finished" in r.getMessage()]
    assert len(lines) >= 3, lines
    assert all(line.startswith("step 1, ") and " of 6 rollouts finished, " in line for line in lines)
    assert "0 of 6 rollouts finished, 2 running, 4 queued" in lines[0]
    assert float(lines[-1].split("; ")[1].split()[0]) > 0  # completion tokens/s once rollouts have finished
    tokens = sum(len(call.completion_token_ids or []) for rollout in step.rollouts for call in rollout.llm_calls)
    assert tokens and source.progress() == RolloutProgress(finished=0, running=0, queued=0, completion_tokens=tokens)
