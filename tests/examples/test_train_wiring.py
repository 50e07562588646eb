"""The GPU recipes of the examples hand ``agl.train`` arguments it accepts, with the right agent, roles and data.

(Running them needs a GPU and model weights; the dry runs in the other test files cover the rollout path.)
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from agentlightning.trainers.config import TrainConfig

import agentlightning as agl
from agentlightning.rl.air import ToolErrorRule
from examples.calc_x import train as calc_train
from examples.rag import train as rag_train
from examples.spider import train as spider_train


def _bind(plan: dict) -> dict:
    """The arguments ``agl.train`` receives for ``plan``; every option must be a valid TrainConfig field."""
    arguments = inspect.signature(agl.train).bind(model="unused", tokenizer=None, **plan).arguments
    options = arguments.pop("options", {})
    TrainConfig.from_options(None, options)
    return {**arguments, **options}


def test_spider_plan(data_dir: Path) -> None:
    arguments = spider_train.parser().parse_args(["--data-dir", str(data_dir), "--val-size", "50", "--lora"])
    bound = _bind(spider_train.training_plan(arguments))
    assert bound["agent"].name == "sql_agent" and bound["roles"] == ["writer", "rewriter"]
    assert len(bound["dataset"]) + 235 == 972 and len(bound["val_dataset"]) == 50
    assert not {t["db_id"] for t in bound["dataset"]} & {t["db_id"] for t in bound["val_dataset"]}
    assert bound["lora"] is True and bound["group_size"] == 8 and bound["algorithm"] == "grpo"


def test_rag_plan(data_dir: Path) -> None:
    arguments = rag_train.parser().parse_args(["--data-dir", str(data_dir), "--max-steps", "3"])
    bound = _bind(rag_train.training_plan(arguments))
    assert bound["roles"] == ["rag_agent"] and bound["max_steps"] == 3
    assert len(bound["dataset"]) == 200 and len(bound["val_dataset"]) == 100
    assert all(task["data_dir"] == str(data_dir.resolve()) for task in bound["dataset"])


def test_calc_x_plan_has_air(data_dir: Path) -> None:
    arguments = calc_train.parser().parse_args(
        ["--data-dir", str(data_dir), "--sources", "svamp", "--tool-error-penalty", "-0.25"]
    )
    bound = _bind(calc_train.training_plan(arguments))
    assert bound["roles"] == ["calculator_assistant"]
    (rule,) = bound["air"]
    assert isinstance(rule, ToolErrorRule) and rule.penalty == -0.25
    assert len(bound["dataset"]) == 700 and len(bound["val_dataset"]) == 300


def test_bad_option_is_refused_by_the_parser(data_dir: Path) -> None:
    with pytest.raises(SystemExit):
        calc_train.parser().parse_args(["--sources", "math"])


@pytest.mark.parametrize("example", [spider_train, rag_train, calc_train], ids=["spider", "rag", "calc_x"])
def test_gpu_config_reaches_agl_train(example, data_dir: Path) -> None:
    config = Path(example.__file__).parent / "configs" / "gpu.json"
    arguments = example.parser().parse_args(["--data-dir", str(data_dir), "--config", str(config)])
    plan = example.training_plan(arguments)
    assert plan["backend"] == "vllm" and plan["model"].startswith("Qwen/Qwen2.5-")
    bound = _bind({key: value for key, value in plan.items() if key != "model"})
    assert bound["max_steps"] > 10 and bound["vllm"]["dtype"] == "bfloat16"


@pytest.mark.parametrize("example", [spider_train, rag_train, calc_train], ids=["spider", "rag", "calc_x"])
def test_the_flag_a_run_that_trained_nothing_names_is_there(example, data_dir: Path) -> None:
    """A run in which no step updated the model ends with agl.NothingTrainedError, whose message says to pass
    --allow-no-update: each example takes that flag (they refused it as an unknown argument)."""
    arguments = example.parser().parse_args(["--data-dir", str(data_dir), "--allow-no-update"])
    assert _bind(example.training_plan(arguments))["allow_no_update"] is True
