"""The agent of ``bench_worker_memory.py``, in a module of its own as a user's ``agl client --agent mod:agent`` would
be: the README's agent, a fresh ``openai.OpenAI`` client per rollout and one chat call.

With ``$AGL_BENCH_PROBE`` set to a file path, the worker process that imports this module also looks inside itself:
tracemalloc runs from import, and every ``$AGL_BENCH_PROBE_EVERY`` rollouts (default 250) the agent appends one JSON
line to that file: the rollout count, RSS before and after a ``gc.collect()``, how many objects it found unreachable,
then (collected) the memory tracemalloc traces, the live objects by type, and the allocation sites grown most since the
first probe. The collections change what RSS does afterwards: measure RSS in runs without the probe.
"""

from __future__ import annotations

import collections
import gc
import json
import linecache
import os
import tracemalloc
from pathlib import Path
from typing import Any

from openai import OpenAI

import agentlightning as agl

PROBE = os.environ.get("AGL_BENCH_PROBE")
PROBE_EVERY = int(os.environ.get("AGL_BENCH_PROBE_EVERY", "250"))
if PROBE:
    tracemalloc.start(16)
_rollouts = 0
_first: tracemalloc.Snapshot | None = None


@agl.rollout
def readme_agent(task: dict, llm: agl.LLM) -> float:
    """One chat call through the rollout's LLM, as in the README; 1.0 when the mock echoes the question."""
    global _rollouts
    client = OpenAI(base_url=llm.base_url, api_key=llm.api_key)
    reply = client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": task["question"]}])
    _rollouts += 1
    if PROBE and _rollouts % PROBE_EVERY == 0:
        _probe(Path(PROBE))
    return 1.0 if task["question"] in (reply.choices[0].message.content or "") else 0.0


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _probe(path: Path) -> None:
    """Append what this process holds now (see the module docstring)."""
    global _first
    rss_before = _rss_mb()
    unreachable = gc.collect()
    own = [tracemalloc.Filter(False, module.__file__) for module in (tracemalloc, linecache)]  # the probe's own
    snapshot = tracemalloc.take_snapshot().filter_traces(own)
    by_type = collections.Counter(type(o).__qualname__ for o in gc.get_objects())
    entry: dict[str, Any] = {
        "rollouts": _rollouts,
        "rss_mb": round(rss_before, 1),
        "rss_collected_mb": round(_rss_mb(), 1),
        "traced_mb": round(tracemalloc.get_traced_memory()[0] / 2**20, 2),
        "unreachable": unreachable,
        "gc_objects": len(gc.get_objects()),
        "types": dict(by_type.most_common(25)),
    }
    if _first is None:
        _first = snapshot
    else:
        entry["grown"] = [
            f"{stat.size_diff / 1024:+.0f} KiB {stat.count_diff:+d} blocks {stat.traceback.format(limit=4)}"
            for stat in snapshot.compare_to(_first, "traceback")[:12]
        ]
    with path.open("a") as out:
        out.write(json.dumps(entry) + "\n")
