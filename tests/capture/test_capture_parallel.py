"""50 rollouts at once, in threads and in asyncio: every captured call lands in the rollout that made it."""

from __future__ import annotations

import asyncio
import contextvars
import sys
import threading

import openai

import agentlightning as agl
from agentlightning.testing import MockLLMServer, MockReply, MockRequest

N = 50


def reply_with_marker(request: MockRequest) -> MockReply:
    # The reply names the rollout's own marker, so a call attributed to the wrong rollout is detectable.
    return MockReply(content=f"answer for {request.last_user_text}", latency=0.01)


def check_attribution(rollouts: list[agl.Rollout], calls_per_rollout: int) -> None:
    assert len(rollouts) == N
    assert len({r.rollout_id for r in rollouts}) == N
    for index, rollout in enumerate(rollouts):
        assert rollout.status == "succeeded", rollout.error
        assert rollout.task == {"id": index, "marker": f"m{index}"}
        assert len(rollout.calls) == calls_per_rollout
        assert [c.sequence for c in rollout.calls] == list(range(calls_per_rollout))
        for step, call in enumerate(rollout.calls):
            marker = f"m{index}-step{step}"
            assert call.input[-1]["content"] == marker
            assert call.output["content"] == f"answer for {marker}"
            assert call.rollout_id == rollout.rollout_id
            assert call.role == ("planner" if step == 0 else "writer")
        assert rollout.final_reward == float(index)


def test_50_thread_rollouts_no_cross_attribution() -> None:
    @agl.rollout
    def agent(task: dict, llm: agl.LLM) -> float:
        client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
        for step in range(3):
            with agl.role("planner" if step == 0 else "writer"):
                marker = f"{task['marker']}-step{step}"
                reply = client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": marker}])
                assert reply.choices[0].message.content.endswith(marker)
        return float(task["id"])

    with MockLLMServer(handler=reply_with_marker) as server:
        tasks = [{"id": i, "marker": f"m{i}"} for i in range(N)]
        rollouts = agl.run(agent, tasks, llm=server.llm(), n_workers=N)
    check_attribution(rollouts, 3)


def test_50_asyncio_rollouts_no_cross_attribution() -> None:
    @agl.rollout
    async def agent(task: dict, llm: agl.LLM) -> float:
        client = openai.AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
        for step in range(3):
            with agl.role("planner" if step == 0 else "writer"):
                marker = f"{task['marker']}-step{step}"
                if step == 2:  # a streamed call interleaves chunk by chunk with the other rollouts
                    stream = await client.chat.completions.create(
                        model=llm.model, messages=[{"role": "user", "content": marker}], stream=True
                    )
                    async for _ in stream:
                        await asyncio.sleep(0)
                else:
                    await client.chat.completions.create(
                        model=llm.model, messages=[{"role": "user", "content": marker}]
                    )
        await client.close()
        return float(task["id"])

    with MockLLMServer(handler=reply_with_marker) as server:
        tasks = [{"id": i, "marker": f"m{i}"} for i in range(N)]
        rollouts = agl.run(agent, tasks, llm=server.llm(), n_workers=N)
    check_attribution(rollouts, 3)


def test_agent_threads_with_copied_context_are_attributed() -> None:
    @agl.rollout
    def agent(task: dict, llm: agl.LLM) -> float:
        client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)

        def step(n: int) -> None:
            client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": f"{task['id']}-{n}"}])

        threads = [threading.Thread(target=contextvars.copy_context().run, args=(step, n)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return 1.0

    with MockLLMServer() as server:
        rollouts = agl.run(agent, [{"id": i} for i in range(8)], llm=server.llm(), n_workers=8)
    for rollout in rollouts:
        contents = sorted(call.input[-1]["content"] for call in rollout.calls)
        assert contents == [f"{rollout.task['id']}-{n}" for n in range(4)]


def test_calls_come_back_in_sequence_order_whatever_order_they_were_attached_in() -> None:
    from agentlightning.capture._context import RolloutRecorder

    recorder = RolloutRecorder("ro")
    for sequence in (2, 0, 1):  # as when threads of one rollout race between taking a sequence and attaching
        recorder.add_call(agl.Call(sequence=sequence))
    assert [c.sequence for c in recorder.calls] == [0, 1, 2]
    assert {c.rollout_id for c in recorder.calls} == {"ro"}


def test_readers_racing_with_calls_all_see_the_same_records() -> None:
    """Reading a rollout's calls takes no lock: readers in other threads build records concurrently, and every
    reader must see the same call ids as the rollout finally keeps (records are built deterministically)."""
    from agentlightning.capture._context import RolloutRecorder, recording

    agl.instrument("openai")
    recorder = RolloutRecorder("ro")
    seen: list[set[str]] = []
    done = threading.Event()

    def reader() -> None:
        ids: set[str] = set()
        while not done.is_set():
            ids.update(call.call_id for call in recorder.calls)
        seen.append(ids)

    readers = [threading.Thread(target=reader) for _ in range(4)]
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible, so that readers race inside builds
    try:
        with MockLLMServer(handler=reply_with_marker) as server:
            client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)

            def caller(index: int) -> None:
                for step in range(5):
                    client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"{index}-{step}"}])

            for thread in readers:
                thread.start()
            with recording(recorder):
                callers = [threading.Thread(target=contextvars.copy_context().run, args=(caller, i)) for i in range(4)]
                for thread in callers:
                    thread.start()
                for thread in callers:
                    thread.join()
    finally:
        done.set()
        for thread in readers:
            thread.join()
        sys.setswitchinterval(switch_interval)
    final = recorder.calls
    assert len(final) == 20 and [call.sequence for call in final] == list(range(20))
    assert set().union(*seen) == {call.call_id for call in final}
