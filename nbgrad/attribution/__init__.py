"""Attribution on top of the engine: saliency, gradient × input and integrated gradients at any site
(`attribute`), attribution patching checked by exact patching (`attribution_patching`), and the
`Attribution` they return. The engine never imports this package."""
from .gradients import attribute
from .patching import attribution_patching
from .result import Attribution

__all__ = ["attribute", "attribution_patching", "Attribution"]
