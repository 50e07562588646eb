"""Several policies in one run (``agl.train(policies=...)``): one LoRA adapter per role on the tiny model, served by
the HF backend by role, trained apart (own update, optimizer, version), checkpointed and resumed together."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch
from agentlightning.trainers.checkpoint import load_checkpoint, save_checkpoint
from agentlightning.trainers.config import TrainConfig
from agentlightning.trainers.learner.batch import pack
from agentlightning.trainers.models import tiny_model
from agentlightning.trainers.policies import Policy, PolicyMap
from train_agents import writer_rewriter_agent

import agentlightning as agl
from agentlightning.protocol import ROLE_HEADER
from agentlightning.server import SQLiteStore
from agentlightning.types import Transition

pytest.importorskip("peft")

LORA = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}
POLICIES = {"writer": Policy(lora=LORA), "rewriter": Policy(lora=LORA, learning_rate=5e-2), "checker": None}


def _policy_set(tmp_path, seed: int = 3):
    from agentlightning.trainers.learner._policy_set import PolicySet
    from agentlightning.trainers.learner.grpo import grpo_config
    from peft import LoraConfig

    model, tokenizer = tiny_model(seed=seed)
    mapping = PolicyMap.parse(POLICIES)
    adapters = {name: LoraConfig(task_type="CAUSAL_LM", **LORA) for name in mapping.policies}
    args = {
        name: grpo_config(str(tmp_path / name), micro_batch_size=4, learning_rate=0.2, optim="sgd", max_grad_norm=0.0)
        for name in mapping.policies
    }
    return PolicySet.of_adapters(model, tokenizer, mapping, adapters, args), tokenizer


def _adapter(model, name: str) -> dict[str, torch.Tensor]:
    return {key: value.detach().clone() for key, value in model.named_parameters() if f".{name}." in key}


def _batch(role: str):
    rows = [
        Transition(
            rollout_id=f"r{i}",
            group_id="g",
            index=0,
            role=role,
            prompt_token_ids=[5, 6, 7, 8],
            completion_token_ids=[9 + i, 10, 11],
            advantage=1.0 if i % 2 else -1.0,
            reward=float(i % 2),
        )
        for i in range(4)
    ]
    return pack(rows, pad_token_id=0)


def test_policy_map_routes_roles_and_rejects_ambiguous_or_bad_input():
    mapping = PolicyMap.parse({"writer": True, "re*": Policy(name="rewriters"), "checker": None})
    assert mapping.policy_of("writer") == "writer" and mapping.policy_of("rewriter") == "rewriters"
    assert mapping.policy_of("checker") is None and mapping.policy_of("someone") is None
    assert mapping.policy_of(None) is None and mapping.trained_roles == ["writer", "re*"]
    shared = Policy()
    assert list(PolicyMap.parse({"a": shared, "b": shared}).policies) == ["a"]  # one policy for both roles
    assert list(PolicyMap.parse({"a": True, "b": True}).policies) == ["a", "b"]
    with pytest.raises(ValueError, match="matches 'writer' .* 'w\\*'"):
        PolicyMap.parse({"writer": True, "w*": Policy(name="w")})
    with pytest.raises(ValueError, match="matches"):
        PolicyMap.parse({"a*": Policy(name="a"), "*b": Policy(name="b")}, declared_roles=["ab"])
    with pytest.raises(ValueError, match="glob key .* needs a policy name"):
        PolicyMap.parse({"writer*": True})
    with pytest.raises(ValueError, match="at least one policy must be trained"):
        PolicyMap.parse({"writer": None})
    with pytest.raises(TypeError, match="agl.Policy"):
        PolicyMap.parse({"writer": "lora"})
    with pytest.raises(ValueError, match="not both"):
        TrainConfig(roles=["writer"], policies={"writer": True})
    with pytest.raises(ValueError, match="learning_rate"):
        Policy(learning_rate=-1)


def test_credit_per_policy_receives_the_policy_name():
    seen = []

    def credit(rollout, calls, policy):
        seen.append((policy, [call.role for call in calls]))
        return [10.0 if policy == "writer" else 1.0] * len(calls)

    mapping = PolicyMap.parse({"writer": Policy(credit=credit), "rewriter": Policy(credit=credit), "checker": None})
    rollout = agl.Rollout(
        rollout_id="r",
        final_reward=0.5,
        status="succeeded",
        calls=[
            agl.Call(call_id=f"c{i}", rollout_id="r", sequence=i, kind="llm", role=role)
            for i, role in enumerate(["writer", "rewriter", "writer"])
        ],
    )
    assert mapping.credit("identical")(rollout, rollout.calls) == [10.0, 1.0, 10.0]
    assert seen == [("writer", ["writer", "writer"]), ("rewriter", ["rewriter"])]


def test_hf_backend_serves_each_role_by_its_adapter_in_one_batch(tmp_path):
    from agentlightning.trainers.backends.hf.server import HFBackendServer

    policies, tokenizer = _policy_set(tmp_path)
    with torch.no_grad():  # make the adapters differ from each other and from the base
        for key, value in policies.model.named_parameters():
            if ".writer." in key or ".rewriter." in key:
                value.normal_(0, 2.0 if ".writer." in key else 0.5)
    backend = HFBackendServer(
        policies.model, tokenizer, policies=policies.policies, max_batch_size=8, batch_wait_s=0.2
    ).start()
    try:

        def ask(role: str | None) -> tuple[list[int], str | None, str]:
            body = {
                "model": "policy",
                "messages": [{"role": "user", "content": "Say something."}],
                "max_tokens": 8,
                "temperature": 0,
            }
            reply = (
                httpx.post(
                    f"{backend.base_url}/chat/completions",
                    json=body,
                    timeout=60,
                    headers={ROLE_HEADER: role} if role else {},
                )
                .raise_for_status()
                .json()
            )
            return reply["choices"][0]["token_ids"], reply.get("policy"), reply["model_version"]

        alone = {role: ask(role) for role in ("writer", "rewriter", "checker", None)}
        assert alone["writer"][1:] == ("writer", "v0") and alone["rewriter"][1:] == ("rewriter", "v0")
        assert alone["checker"][1:] == (None, "base") and alone[None] == alone["checker"]  # unrouted: the base
        outputs = {role: alone[role][0] for role in ("writer", "rewriter", "checker")}
        assert len({tuple(ids) for ids in outputs.values()}) == 3, "different adapters must give different outputs"
        batches = backend.engine.batches_run
        roles = ["writer", "rewriter", "checker"] * 2
        with ThreadPoolExecutor(len(roles)) as pool:
            together = list(pool.map(ask, roles))
        assert backend.engine.batches_run - batches < len(roles), "rows of different adapters share a batch"
        for role, (ids, _, _) in zip(roles, together, strict=True):
            assert ids == outputs[role], f"{role}: a mixed-adapter batch must give what the adapter gives alone"
        models = httpx.get(f"{backend.base_url}/models").json()["data"]
        assert {card["id"] for card in models} == {"policy", "writer", "rewriter"}
        with backend.updating("v1", policy="writer"):
            pass
        assert ask("writer")[2] == "v1" and ask("rewriter")[2] == "v0"
        assert backend.model_version == "rewriter@v0,writer@v1"
    finally:
        backend.stop()


def test_an_update_changes_only_its_policys_adapter_and_checkpoints_keep_both(tmp_path):
    policies, _ = _policy_set(tmp_path)
    before = {name: _adapter(policies.model, name) for name in ("writer", "rewriter")}
    base = {key: value.detach().clone() for key, value in policies.model.named_parameters() if "lora_" not in key}
    policies.step("writer", _batch("writer"))
    writer, rewriter = _adapter(policies.model, "writer"), _adapter(policies.model, "rewriter")
    assert any(not torch.equal(writer[key], before["writer"][key]) for key in writer), "writer's adapter must change"
    assert all(torch.equal(rewriter[key], before["rewriter"][key]) for key in rewriter), "rewriter's must not"
    assert all(torch.equal(value, base[key]) for key, value in policies.model.named_parameters() if key in base)
    assert policies.steps == {"writer": 1, "rewriter": 0}
    policies.step("rewriter", _batch("rewriter"))
    policies.step("writer", _batch("writer"))
    saved = {name: _adapter(policies.model, name) for name in ("writer", "rewriter")}
    path = save_checkpoint(policies, tmp_path / "run", {"step": 2, "global_step": policies.steps})
    assert (path / "policies" / "writer" / "optimizer.pt").exists() and (path / "policies" / "rewriter").is_dir()

    fresh, _ = _policy_set(tmp_path / "fresh")
    load_checkpoint(fresh, path)
    assert fresh.steps == {"writer": 2, "rewriter": 1}
    for name in ("writer", "rewriter"):
        restored = _adapter(fresh.model, name)
        assert all(torch.equal(restored[key], saved[name][key]) for key in restored), name
        assert (
            fresh.trainers[name].optimizer.state_dict()["state"].keys()
            == policies.trainers[name].optimizer.state_dict()["state"].keys()
        )


def test_train_two_policies_through_the_proxy_with_per_policy_versions_and_resume(tmp_path):
    seen: list[str] = []

    def flat_credit(rollout, calls, policy):  # the rewriter gets no signal: it must never be updated
        seen.append(policy)
        return [0.0] * len(calls)

    model, tokenizer = tiny_model(seed=1)
    tasks = [{"id": f"t{i}", "question": f"What is {i} + {i}?"} for i in range(4)]
    options = dict(
        model=model,
        tokenizer=tokenizer,
        group_size=4,
        tasks_per_step=2,
        learning_rate=5e-2,
        micro_batch_size=4,
        max_completion_length=6,
        output_dir=tmp_path / "run",
        nworkers=2,
        progress=False,
        save_model=False,
        policies={"writer": Policy(lora=LORA), "rewriter": Policy(lora=LORA, credit=flat_credit), "checker": None},
    )
    result = agl.train(writer_rewriter_agent, tasks, max_steps=2, **options)

    first, second = result.history
    assert first["policy/writer/model_version"] == "v1" and second["policy/writer/model_version"] == "v2"
    assert second["policy/rewriter/skipped_update"] == 1 and second["policy/rewriter/model_version"] == "v0"
    assert first["policy/writer/transitions"] == 8 and first["policy/rewriter/transitions"] == 8
    assert first["policy/writer/train/rows"] > 0 and "policy/rewriter/train/rows" not in first
    assert set(seen) == {"rewriter"}
    assert second["calls_on_version"] == second["llm_calls"] == 24  # every call by its policy's current version
    assert result.model_version == "rewriter@v0,writer@v2"
    writer, rewriter = _adapter(result.model, "writer"), _adapter(result.model, "rewriter")
    # PEFT starts LoRA's B at zero: the writer's B moved, the never-updated rewriter's did not.
    assert any(value.abs().max() > 0 for key, value in writer.items() if "lora_B" in key)
    assert all(value.abs().max() == 0 for key, value in rewriter.items() if "lora_B" in key)

    store = SQLiteStore(tmp_path / "run" / "store.db")
    try:
        step_two = [store.get_rollout(info.rollout_id) for info in store.list_rollouts()]
        step_two = [rollout for rollout in step_two if rollout.group_id.startswith("step1")]
        assert len(step_two) == 8
        for rollout in step_two:
            served = {
                call.role: (call.metadata.get("policy"), call.metadata.get("model_version"))
                for call in rollout.llm_calls
            }
            assert served == {"writer": ("writer", "v1"), "rewriter": ("rewriter", "v0"), "checker": (None, "base")}
            assert all(call.token_source == "server" for call in rollout.llm_calls)
    finally:
        store.close()

    model, tokenizer = tiny_model(seed=1)
    resumed = agl.train(
        writer_rewriter_agent, tasks, max_steps=3, resume=True, **{**options, "model": model, "tokenizer": tokenizer}
    )
    last = resumed.history[-1]
    assert last["step"] == 3 and last["model_version"] == "rewriter@v0,writer@v2"  # served the restored adapters
    assert last["policy/writer/model_version"] == "v3" and resumed.model_version == "rewriter@v0,writer@v3"
    restored_rewriter = _adapter(resumed.model, "rewriter")
    assert all(torch.equal(restored_rewriter[key], rewriter[key]) for key in rewriter)


def _perturb(model, names: tuple[str, ...] = ("writer", "rewriter"), std: float = 0.3) -> None:
    with torch.no_grad():
        for key, value in model.named_parameters():
            if any(f".{name}." in key for name in names) and "lora_" in key:
                value.normal_(0, std)


def test_vllm_backend_loads_each_policys_adapter_by_name(tmp_path):
    """VLLMBackend's multi-LoRA sync against a stand-in for vLLM's LoRA endpoints (``/v1/load_lora_adapter`` and
    ``/v1/unload_lora_adapter``); the real server is driven by the next test where .venv-vllm exists."""
    from agentlightning.trainers.backends.vllm.server import VLLMBackend
    from safetensors.torch import load_file
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from agentlightning._uvicorn import BackgroundServer

    requests: list[tuple[str, dict]] = []
    files: dict[str, dict[str, torch.Tensor]] = {}

    async def models(request):
        return JSONResponse({"data": [{"id": "tiny"}]})

    async def version(request):  # how VLLMBackend(url=...) tells vLLM from another OpenAI-compatible server
        return JSONResponse({"version": "stand-in"})

    async def lora(request):
        body = await request.json()
        requests.append((request.url.path, body))
        if "lora_path" in body:  # read what was saved while it is there
            files[body["lora_name"]] = load_file(f"{body['lora_path']}/adapter_model.safetensors")
        return JSONResponse({})

    app = Starlette(
        routes=[
            Route("/v1/models", models),
            Route("/version", version),
            Route("/v1/load_lora_adapter", lora, methods=["POST"]),
            Route("/v1/unload_lora_adapter", lora, methods=["POST"]),
        ]
    )
    policies, _ = _policy_set(tmp_path)
    _perturb(policies.model)
    server = BackgroundServer(app, "127.0.0.1", 0, name="vllm-stand-in").start()
    backend = VLLMBackend(
        url=f"http://127.0.0.1:{server.port}", policy=policies.model, sync="lora", policies=policies.policies
    )
    try:
        backend.start()
        for name in ("writer", "rewriter"):
            with backend.updating("v0", policy=name):
                pass
        with backend.updating("v1", policy="writer"):
            pass
        assert backend.served("writer") == ("tiny-writer-v1", "v1")
        assert backend.served("rewriter") == ("tiny-rewriter-v0", "v0")
        assert backend.served(None) == ("tiny", "base")
        assert backend.model_version == "rewriter@v0,writer@v1"
    finally:
        backend.stop()
        server.stop()
    loads = [body["lora_name"] for path, body in requests if path.endswith("load_lora_adapter") and "lora_path" in body]
    unloads = [body["lora_name"] for path, body in requests if path.endswith("unload_lora_adapter")]
    assert loads == ["tiny-writer-v0", "tiny-rewriter-v0", "tiny-writer-v1"]
    assert unloads == ["tiny-writer-v0", "tiny-writer-v1", "tiny-rewriter-v0"]  # the replaced one, then at stop
    for name in ("writer", "rewriter"):  # each load holds that policy's adapter, not the other's
        saved = files[f"tiny-{name}-v0"]
        own = {key: value for key, value in _adapter(policies.model, name).items()}
        assert len(saved) == len(own) > 0
        for key, value in saved.items():
            match = next(v for k, v in own.items() if k.replace(f".{name}", "") == key)
            assert torch.equal(value, match), key


def test_vllm_serves_two_policies_as_lora_adapters_at_once(served, tmp_path):
    """Where .venv-vllm exists: two adapters hot-loaded by name into one vLLM server, each matching the trainer."""
    from agentlightning.trainers.backends.vllm.server import VLLMBackend
    from peft import LoraConfig, get_peft_model

    server, model, tokenizer = served
    import copy

    config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    peft_model = get_peft_model(copy.deepcopy(model), config, adapter_name="writer")
    peft_model.add_adapter("rewriter", config)
    _perturb(peft_model)
    question = [{"role": "user", "content": "What is 1 + 2?"}]
    backend = VLLMBackend(
        url=server.url,
        policy=peft_model,
        tokenizer=tokenizer,
        sync="lora",
        check_messages=question,
        policies=PolicyMap.parse({"writer": True, "rewriter": True}),
    ).start()
    try:
        gaps, answers = {}, {}
        for name in ("writer", "rewriter"):
            with backend.updating("v1", policy=name):
                pass
            gaps[name] = backend.last_logprob_gap
        for name in ("writer", "rewriter"):
            reply = backend.chat(question, model=backend.served(name)[0], max_tokens=8, temperature=0)
            answers[name] = reply["choices"][0]["token_ids"]
        assert max(gaps.values()) < 1e-3, gaps
        assert answers["writer"] != answers["rewriter"]
    finally:
        backend.stop()


def test_proxy_routes_each_role_by_header_base_url_or_model_name(tmp_path):
    """The Lightning proxy serves a call by its role's route: the role from the header the openai and raw-httpx
    captures send (``agl.role``), or, for an agent that cannot be instrumented, the role's own base URL
    (``{llm.base_url}/roles/<role>``) or a ``model`` naming the role."""
    import openai

    from agentlightning.server import LightningServer, Route
    from agentlightning.testing import MockLLMServer

    with (
        MockLLMServer() as mock,
        LightningServer(
            tmp_path / "store.db", upstream_url=mock.base_url, model_name="base", model_version="b0"
        ) as server,
    ):
        server.set_upstream(
            mock.base_url,
            "base",
            "b0",
            routes=[Route(("writer",), "adapter-writer", "v3", "writer"), Route(("check*",), "base", "base", None)],
        )
        [rid] = server.enqueue([{"q": "x"}])
        server.store.dequeue("test-worker", 30.0)

        @agl.rollout
        def agent(task, llm):
            client = openai.OpenAI(base_url=llm.base_url, api_key="x", max_retries=0)
            ask = {"messages": [{"role": "user", "content": "hi"}]}
            with agl.role("writer"):
                client.chat.completions.create(model=llm.model, **ask)
                httpx.post(f"{llm.base_url}/chat/completions", json={"model": llm.model, **ask}).raise_for_status()
            client.chat.completions.create(model="checker", **ask)  # no role known: the model names it
            writer = openai.OpenAI(base_url=f"{llm.base_url}/roles/writer", api_key="x", max_retries=0)
            writer.chat.completions.create(model=llm.model, **ask)  # the role's own base URL names it
            assert [m.id for m in writer.models.list()] == ["base"]
            client.chat.completions.create(model=llm.model, **ask)  # none: the upstream's model
            return 1.0

        agl.run(agent, [{"q": "x"}], llm=agl.LLM(base_url=f"{server.url}/rollouts/{rid}/v1", model="base"))
        assert [request.model for request in mock.requests] == [
            "adapter-writer",
            "adapter-writer",
            "base",
            "adapter-writer",
            "base",
        ]
        seen = [
            (call.role, call.metadata.get("policy"), call.metadata.get("model_version"))
            for call in server.store.proxy_calls(rid)
        ]
        assert seen == [("writer", "writer", "v3")] * 2 + [
            ("checker", None, "base"),
            ("writer", "writer", "v3"),
            (None, None, "b0"),
        ]
