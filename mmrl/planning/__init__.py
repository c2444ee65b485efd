"""Memory planning (`mmrl plan`, docs/scaling.md): architecture sizes, pure memory formulas, fit advice, the report.

Light: nothing here imports torch or loads a model."""

from mmrl.planning.advice import Suggestion, suggest
from mmrl.planning.architectures import Architecture, resolve_architecture
from mmrl.planning.lerobot import FlowVLAArch
from mmrl.planning.memory import MemoryBreakdown, PlanInputs, plan_memory

__all__ = [
    "Architecture",
    "FlowVLAArch",
    "MemoryBreakdown",
    "PlanInputs",
    "Suggestion",
    "plan_memory",
    "resolve_architecture",
    "suggest",
]
