"""Several policies in one run: ``agl.train(agent, dataset, policies={...})`` maps roles to policies.

    agl.train(sql_agent, dataset, policies={
        "writer": agl.Policy(learning_rate=2e-5),   # its own LoRA adapter on the shared base model
        "rewriter": True,                           # a LoRA adapter with the run's settings
        "check*": None,                             # served by the frozen base model, never trained
    })

Keys are role names or globs; values are a :class:`Policy`, ``True`` / a dict of ``peft.LoraConfig`` fields / a
``LoraConfig`` (a policy with that adapter), or ``None`` (the frozen base). The same :class:`Policy` object under
several keys is one policy for all those roles. A policy is named after its key unless ``Policy(name=...)`` says
otherwise (a glob key needs a name). Roles no key matches are served by the frozen base too.

:class:`PolicyMap` is the checked mapping and the routing rule (:meth:`PolicyMap.policy_of`): a call is served by
the policy whose key matches its role; a role matched by keys of two different policies is an error. Nothing
here imports torch.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentlightning.errors import ConfigError
from agentlightning.rl.credit import CreditFunction, assign_credit, resolve_credit
from agentlightning.types import Call, Rollout, role_matches

BASE_VERSION = "base"
"""The model version recorded on calls served by the frozen base model."""

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")  # also a PEFT adapter name: no '.'
_GLOB = re.compile(r"[*?\[]")
_POLICY_FIELDS = frozenset({"lora", "learning_rate", "credit", "name"})


@dataclass(frozen=True)
class Policy:
    """One trained policy: a LoRA adapter on the shared base model, with its own optimizer.

    ``lora``: None (the run's ``lora`` setting, else rank 16 on attention and MLP projections), True, a dict of
    ``peft.LoraConfig`` fields or a ``LoraConfig``. ``learning_rate``: None uses the run's. ``credit``: None uses
    the run's credit assignment; a credit function with a ``policy`` parameter receives the policy's name.
    """

    lora: Any = None
    learning_rate: float | None = None
    credit: Any = None
    name: str | None = None

    def __post_init__(self) -> None:
        rate = self.learning_rate
        if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0):
            raise ConfigError(f"agl.Policy(learning_rate={self.learning_rate!r}): must be a number > 0")
        if self.name is not None and not (isinstance(self.name, str) and _NAME.match(self.name)):
            raise ConfigError(f"agl.Policy(name={self.name!r}): use letters, digits, '_' or '-' (it names an adapter)")
        if self.credit is not None:
            resolve_credit(self.credit)


@dataclass
class PolicyMap:
    """The checked ``policies=`` mapping: ``routes`` (key, policy name or None for the frozen base), in order, and
    the trained ``policies`` by name."""

    routes: list[tuple[str, str | None]]
    policies: dict[str, Policy]
    _cache: dict[str | None, str | None] = field(default_factory=dict, repr=False)

    @classmethod
    def parse(cls, policies: Mapping[str, Any], declared_roles: Sequence[str] | None = None) -> PolicyMap:
        """Check ``policies`` (see the module docstring); ``declared_roles`` (the agent's ``roles``) must each be
        matched by at most one policy."""
        if not isinstance(policies, Mapping) or not policies:
            raise ConfigError(f"agl.train(policies={policies!r}): use a non-empty dict of role (glob) -> Policy / None")
        routes: list[tuple[str, str | None]] = []
        named: dict[str, Policy] = {}
        shared: dict[int, str] = {}
        for key, value in policies.items():
            if not isinstance(key, str) or not key:
                raise ConfigError(f"agl.train(policies=...): keys are role names or globs, got {key!r}")
            if value is None:
                routes.append((key, None))
                continue
            policy = _as_policy(key, value)
            name = policy.name or shared.get(id(policy)) or key
            shared.setdefault(id(policy), name)  # one Policy object under several keys: one policy
            if name == key and not _NAME.match(key):
                raise ConfigError(
                    f"agl.train(policies={{{key!r}: ...}}): a glob key (or one with characters an adapter name cannot "
                    "have) needs a policy name, e.g. "
                    f"agl.Policy(name='{re.sub(r'[^A-Za-z0-9_]+', '_', key).strip('_') or 'policy'}')"
                )
            if name in named and named[name] is not policy:
                raise ConfigError(f"agl.train(policies=...): two different policies are named {name!r}")
            named[name] = policy
            routes.append((key, name))
        if not named:
            raise ConfigError("agl.train(policies=...): every role maps to None; at least one policy must be trained")
        mapping = cls(routes, named)
        for role in list(declared_roles or []) + [key for key, _ in routes]:
            if not _GLOB.search(role):
                mapping.policy_of(role)  # a literal role (declared, or a key) matched by two policies fails here
        return mapping

    @property
    def trained_roles(self) -> list[str]:
        """The keys of trained policies (the roles whose calls become transitions)."""
        return [key for key, name in self.routes if name is not None]

    def roles_of(self, name: str) -> list[str]:
        """The keys that map to policy ``name``."""
        return [key for key, policy in self.routes if policy == name]

    def policy_of(self, role: str | None) -> str | None:
        """The policy serving and training ``role``'s calls; None for the frozen base. ``ValueError`` when keys of
        two different policies match it."""
        if role in self._cache:
            return self._cache[role]
        matches = [(key, name) for key, name in self.routes if role_matches(role, [key])]
        chosen = {name for _, name in matches}
        if len(chosen) > 1:
            found = ", ".join(f"{key!r} ({name or 'frozen base'})" for key, name in matches)
            raise ConfigError(
                f"agl.train(policies=...): role {role!r} matches {found}; each role must map to one "
                "policy (make the keys disjoint)"
            )
        self._cache[role] = chosen.pop() if chosen else None
        return self._cache[role]

    def credit(self, default: Any) -> CreditFunction:
        """One credit function for the calls of every trained policy: each policy's calls (in order) get their
        policy's credit (``Policy.credit``, else ``default``), called with ``policy=<name>`` when it accepts it."""
        functions = {
            name: _with_policy(resolve_credit(policy.credit or default), name) for name, policy in self.policies.items()
        }

        def per_policy(rollout: Rollout, calls: Sequence[Call]) -> list[float]:
            values = [0.0] * len(calls)
            positions: dict[str, list[int]] = {}
            for index, call in enumerate(calls):
                name = self.policy_of(call.role)
                if name is not None:
                    positions.setdefault(name, []).append(index)
            for name, indices in positions.items():
                credited = assign_credit(functions[name], rollout, [calls[i] for i in indices])
                for index, value in zip(indices, credited, strict=True):
                    values[index] = value
            return values

        per_policy.__qualname__ = "per_policy_credit"
        return per_policy


def _as_policy(key: str, value: Any) -> Policy:
    if isinstance(value, Policy):
        return value
    if isinstance(value, dict) and value and set(value) <= _POLICY_FIELDS:  # from a config file
        return Policy(**value)
    if value is True or isinstance(value, dict) or type(value).__name__ == "LoraConfig":
        return Policy(lora=value)
    raise TypeError(
        f"agl.train(policies={{{key!r}: {value!r}}}): use agl.Policy(...), True, a dict of LoraConfig fields, a "
        "LoraConfig, or None (frozen base)"
    )


def _with_policy(function: CreditFunction, name: str) -> CreditFunction:
    """``function`` called with ``policy=name`` when it has such a parameter."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return function
    if "policy" not in parameters:
        return function

    def credit(rollout: Rollout, calls: Sequence[Call]) -> Sequence[float]:
        return function(rollout, calls, policy=name)  # type: ignore[call-arg]

    credit.__qualname__ = f"{getattr(function, '__qualname__', 'credit')}[{name}]"
    return credit


def serving_routes(policies: PolicyMap, served: Callable[[str | None], tuple[str, str]]) -> list[Any]:
    """The proxy's routes (``agentlightning.server.Route``) for ``policies``, ``served(policy)`` giving the model
    name and version that serve a policy now (None: the frozen base)."""
    from agentlightning.server import Route

    routes = []
    for key, name in policies.routes:
        model, version = served(name)
        routes.append(Route(roles=(key,), model_name=model, model_version=version, policy=name))
    return routes


def combined_version(versions: Mapping[str | None, str]) -> str:
    """One version string for several policies' versions: ``"rewriter@v2,writer@v3"`` (the base left out)."""
    return ",".join(f"{name}@{version}" for name, version in sorted(versions.items(), key=str) if name is not None)
