"""Composed ``dspy.Module`` stages (no prompt text here): episodic integration, semantic distillation,
response generation, and the ``NemoriPipeline`` that wires them."""

from .episodic import EpisodicIntegration
from .pipeline import NemoriPipeline, ProcessReport, stage_factory
from .resources import Resources
from .response import ResponseGeneration
from .semantic import SemanticDistillation

__all__ = ["EpisodicIntegration", "SemanticDistillation", "ResponseGeneration", "NemoriPipeline",
           "ProcessReport", "Resources", "stage_factory"]
