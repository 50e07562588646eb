"""LightningRL: rollouts -> transitions (credit assignment, AIR) -> advantages -> padded batches.

Everything here is pure Python except :func:`pack`, which imports torch and numpy when it runs.
"""

from agentlightning.rl.advantages import ESTIMATORS, WEIGHTINGS, compute_advantages
from agentlightning.rl.air import AIR, AirRule, CallRule, FormatRule, LLMErrorRule, ToolErrorRule
from agentlightning.rl.batch import PackedBatch, PackStats, pack
from agentlightning.rl.credit import CREDIT_FUNCTIONS, CreditFunction, discounted, identical, last
from agentlightning.rl.transitions import Extraction, ExtractionStats, extract_transitions, transitions

__all__ = ["AIR", "CREDIT_FUNCTIONS", "ESTIMATORS", "WEIGHTINGS", "AirRule", "CallRule", "CreditFunction", "Extraction",
           "ExtractionStats", "FormatRule", "LLMErrorRule", "PackStats", "PackedBatch", "ToolErrorRule",
           "compute_advantages", "discounted", "extract_transitions", "identical", "last", "pack", "transitions"]
