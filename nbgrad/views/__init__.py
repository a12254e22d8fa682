"""Panels and pictures. Computed in the kernel, bounded in size, with static fallbacks.

Why a folder: a picture takes plain data (tensors, dicts, strings) and imports nothing else of nbgrad, so
any room can draw with it and a panel can be tested without running a model."""
from .panel import MIME_TYPE, Panel, panel_for_result, show
from .tokens import token_heatmap
from .attention import attention_pattern

__all__ = ["MIME_TYPE", "Panel", "panel_for_result", "show", "token_heatmap", "attention_pattern"]
