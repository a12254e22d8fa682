"""Which family a model belongs to, and the facts of that model the canonical names need (its number of
layers and heads, whether a path starts below a base model)."""
from __future__ import annotations

from torch import nn

from ..errors import NbgradError
from .families import FAMILIES, ByFlag

_QKV = {"q": 1, "k": 2, "v": 3}      # their places among the attention function's arguments (after the module)

# model classes registered by class (a custom model of one's own): class -> family entry
_BY_CLASS: dict[type, dict] = {}


def register(model_class_or_family, paths: dict) -> None:
    """Add a family: `model_class_or_family` is a model class (its instances use `paths`) or a family name
    (`config.model_type`); `paths` has the keys of `nbgrad.names.FAMILIES` entries (see families.py)."""
    if not isinstance(paths, dict):
        raise NbgradError(f"nbgrad.names.register takes a dict of paths, not {type(paths).__name__}")
    if isinstance(model_class_or_family, type):
        _BY_CLASS[model_class_or_family] = dict(paths)
    elif isinstance(model_class_or_family, str):
        FAMILIES[model_class_or_family] = dict(paths)
    else:
        raise NbgradError("nbgrad.names.register takes a model class or a family name (config.model_type), "
                          f"not {type(model_class_or_family).__name__}")
    registered[0] += 1


registered = [0]      # how many registrations so far: rewritten cells are cached per registration state


def family_name(model: nn.Module) -> str:
    config = getattr(model, "config", None)
    return getattr(config, "model_type", None) or type(model).__name__


def family_of(model: nn.Module) -> dict | None:
    """The family entry for `model` (by its class, then its config's model_type), or None."""
    for cls in type(model).__mro__:
        if cls in _BY_CLASS:
            return _BY_CLASS[cls]
    config = getattr(model, "config", None)
    return FAMILIES.get(getattr(config, "model_type", None))


def unknown_family(model: nn.Module, line: int | None = None) -> NbgradError:
    name, cls = family_name(model), type(model).__name__
    return NbgradError(f"canonical names: nbgrad does not know the family {name!r} ({cls}); add it with "
                       f"nbgrad.names.register({cls}, {{'layers': ..., 'attn': ..., ...}}) (the keys of "
                       f"nbgrad.names.FAMILIES['llama']), or use the model's own module paths", line)


class ModelFacts:
    """One model's canonical names resolved: real paths (from the model) and sizes."""

    def __init__(self, model: nn.Module, entry: dict):
        self.model, self.entry, self.family = model, entry, family_name(model)
        self.prefix = _base_prefix(model, entry)
        layers = self.module(self.root_path("layers")) if entry.get("layers") else None
        self.n_layers = len(layers) if layers is not None else 0
        block = layers[0] if self.n_layers else None
        self.config = config = getattr(model, "config", None)
        self.parallel = _flag(entry.get("parallel", False), config)
        self.heads = getattr(config, "num_attention_heads", None)
        hidden = getattr(config, "hidden_size", None)
        self.head_dim = getattr(config, "head_dim", None) or (hidden // self.heads if hidden and self.heads else None)
        out = _submodule(block, entry.get("attn_out")) if block is not None else None
        self.out_is_conv1d = out is not None and hasattr(out, "nf")       # GPT-2's Conv1D keeps [in, out] weights
        self.block = block

    def root_path(self, name: str) -> str | None:
        """The real path (from the traced model) of a canonical module name on the model, or None."""
        path = self.entry.get(name)
        if path is None:
            return None
        if self.prefix and path.startswith(self.prefix + "."):
            return path[len(self.prefix) + 1:]
        return path if not self.prefix else None

    def attention_event(self, name: str) -> str | None:
        """The event of `attn.q` / `k` / `v` / `pattern` from the attention module, or None where the family has
        none: the table's own `attn_<name>`, else an input of the attention function's call (q, k, v) or its
        softmax's output (pattern)."""
        own = self.entry.get(f"attn_{name}")
        if own is not None:
            return (own.on if _flag(own.flag, self.config) else own.off) if isinstance(own, ByFlag) else own
        site = self.entry.get("attention")
        if site is None:
            return None
        if name == "pattern":
            return f"source.{site}.source.{self.entry['pattern']}.output"
        return f"source.{site}.inputs[0][{_QKV[name]}]"

    def module(self, path: str | None):
        return _submodule(self.model, path)

    def has_block_attribute(self, name: str) -> bool:
        return self.block is not None and hasattr(self.block, name)


def _base_prefix(model: nn.Module, entry: dict) -> str:
    """'' for the model the table's paths start from; the base model's attribute name when `model` is the base
    model itself (`LlamaModel` rather than `LlamaForCausalLM`), so paths drop that first step."""
    first = (entry.get("layers") or "").split(".")[0]
    if not first or hasattr(model, first) or first == entry.get("layers"):
        return ""
    return first


def _flag(value, config) -> bool:
    return bool(getattr(config, value, False)) if isinstance(value, str) else bool(value)


def _submodule(root, path: str | None):
    if root is None or not path:
        return None
    try:
        return root.get_submodule(path)
    except AttributeError:
        return None
