"""Joining the calls a client captured (roles, tools, rewards) with those the proxy recorded for the same rollout
(exact token ids): matched by response id, then in order; unclaimed proxy calls are added by start time."""

from __future__ import annotations

from agentlightning.rl.tokens import merge_records
from agentlightning.types import Call


def join_calls(rollout_id: str, client_calls: list[Call], proxy_calls: list[Call]) -> list[Call]:
    """Merge ``proxy_calls`` (in proxy order) into ``client_calls``; returns the calls renumbered in order. A client
    call already joined (``metadata["proxy_call_id"]``) is not matched again."""
    calls = sorted(client_calls, key=lambda call: call.sequence)
    remaining = list(proxy_calls)
    by_response = {call.response_id: call for call in remaining if call.response_id}
    unmatched: list[Call] = []
    for call in calls:
        if call.kind != "llm" or "proxy_call_id" in call.metadata:
            continue
        proxy = by_response.pop(call.response_id, None) if call.response_id else None
        if proxy is not None:
            remaining.remove(proxy)
            _merge(call, proxy)
        elif _went_through_proxy(call, rollout_id):
            unmatched.append(call)
    for call in unmatched:
        # Both sides knowing (different) response ids means these are not the same call.
        proxy = next((p for p in remaining if not (p.response_id and call.response_id)), None)
        if proxy is not None:
            remaining.remove(proxy)
            _merge(call, proxy)
    merged = list(calls)
    for proxy in sorted(remaining, key=lambda call: call.start_time):  # calls of their own, placed by start time
        position = next((i for i, call in enumerate(merged) if call.start_time > proxy.start_time), len(merged))
        merged.insert(position, proxy)
    for sequence, call in enumerate(merged):
        call.sequence = sequence
        call.rollout_id = rollout_id
    return merged


def join_late_call(rollout_id: str, stored_calls: list[Call], proxy: Call) -> list[Call]:
    """Join a proxy call that landed after the rollout's result was stored (e.g. in flight at the timeout) with the
    rollout's stored calls; the call it became or joined is marked ``metadata["late"] = True``."""
    calls = join_calls(rollout_id, stored_calls, [proxy])
    for call in calls:
        if call.call_id == proxy.call_id or call.metadata.get("proxy_call_id") == proxy.call_id:
            call.metadata["late"] = True
    return calls


def _merge(call: Call, proxy: Call) -> None:
    merge_records(call, proxy)
    call.metadata["proxy_call_id"] = proxy.call_id


def _went_through_proxy(call: Call, rollout_id: str) -> bool:
    """Whether a client call could have been served by this rollout's proxy (unknown endpoints count)."""
    endpoint = call.metadata.get("base_url") or call.metadata.get("endpoint")
    return not isinstance(endpoint, str) or "://" not in endpoint or f"/rollouts/{rollout_id}/" in endpoint + "/"
