"""Instructions per captured call, counted by valgrind: a deterministic measure of the capture code's own work.

End-to-end timings on a shared machine vary by about ±5 us from run to run (see ``bench_capture.py``), so a change
of a few microseconds is judged here instead. The capture work (call start, response reading, record build) runs
on a parsed chat completion in rollouts of six calls, K and 2K times under ``valgrind --tool=cachegrind``; the
difference, divided by K, is the count per call, without start-up or import costs.

Run: ``python tests/benchmarks/capture_instructions.py [--token-ids]`` (needs ``valgrind`` on the PATH; about a
minute). Not collected by pytest.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROLLOUT_CALLS = 6


def capture_work(calls: int, token_ids: bool) -> None:
    """Run the capture work of ``calls`` calls (after a warm-up), in rollouts of ``ROLLOUT_CALLS``."""
    sys.path.insert(0, str(Path(__file__).parent))
    import bench_capture
    import openai
    from agentlightning.adapters._stainless import ClientCall

    from agentlightning.capture._context import RolloutRecorder

    kwargs = {"model": "bench-model", "messages": bench_capture.MESSAGES, "temperature": 0.7, "max_tokens": 128}
    client = bench_capture._client(bench_capture._completion(token_ids))
    response = client.chat.completions.with_raw_response.create(**kwargs).parse()
    resource = client.chat.completions

    def run(count: int) -> None:
        for _ in range(count // ROLLOUT_CALLS):
            recorder = RolloutRecorder("ro-count")
            for _ in range(ROLLOUT_CALLS):
                ClientCall(openai, "chat.completions", recorder, resource, kwargs).handle(response)
            assert len(recorder.calls) == ROLLOUT_CALLS

    run(600)
    run(calls)


def instructions(calls: int, token_ids: bool) -> int:
    """Instructions of a whole process running ``capture_work(calls)``, under valgrind."""
    command = [
        "valgrind",
        "--tool=cachegrind",
        "--cache-sim=no",
        "--cachegrind-out-file=/dev/null",
        sys.executable,
        __file__,
        "--work",
        str(calls),
    ] + (["--token-ids"] if token_ids else [])
    result = subprocess.run(
        command, capture_output=True, text=True, check=True, env={**os.environ, "PYTHONHASHSEED": "0"}
    )
    match = re.search(r"I\s+refs:\s+([\d,]+)", result.stderr)
    if match is None:
        raise RuntimeError(f"no instruction count in valgrind's output:\n{result.stderr[-2000:]}")
    return int(match.group(1).replace(",", ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--token-ids", action="store_true", help="responses carry vLLM-style token ids and logprobs")
    parser.add_argument("--work", type=int, help=argparse.SUPPRESS)  # the measured process
    args = parser.parse_args()
    if args.work is not None:
        capture_work(args.work, args.token_ids)
        return
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (apt install valgrind)")
    calls = 3000
    per_call = (instructions(2 * calls, args.token_ids) - instructions(calls, args.token_ids)) / calls
    label = "with token ids" if args.token_ids else "without token ids"
    print(f"capture work {label}: {per_call:,.0f} instructions per call (rollouts of {ROLLOUT_CALLS})")


if __name__ == "__main__":
    main()
