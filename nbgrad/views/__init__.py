"""Panels and pictures. Computed in the kernel, bounded in size, with static fallbacks."""
from .panel import MIME_TYPE, Panel, panel_for_result, show
from .tokens import token_heatmap
from .attention import attention_pattern

__all__ = ["MIME_TYPE", "Panel", "panel_for_result", "show", "token_heatmap", "attention_pattern"]
