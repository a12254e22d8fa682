"""nbgrad: see and change activations and gradients inside PyTorch models, from a notebook."""
from .api import backward, edit, run_with_cache, save, show, source, trace
from . import datasets  # noqa: F401  (puts the runner of `over=DATASET` into api.trace)
from .attribution import Attribution, attribute, attribution_patching
from .errors import GradError, InputError, ModulePathError, NbgradError, OrderError
from .generation import GenerationResult, generate
from .models import load_model, processor_for, tokenizer_for
from .remote import RemoteModel, Scan, remote, scan
from .engine.results.result import Result
from .engine.results.cache import Cache
from .engine.edit.edits import Edit
from .views.attention import attention_pattern

__version__ = "0.1.0"

__all__ = ["load_model", "tokenizer_for", "processor_for", "trace", "backward", "generate", "save", "show", "Result",
           "edit", "Edit",
           "Cache", "run_with_cache", "remote", "RemoteModel", "scan", "Scan",
           "GenerationResult", "attribute", "attribution_patching", "Attribution", "NbgradError", "GradError",
           "InputError", "ModulePathError", "OrderError", "source", "attention_pattern", "__version__"]


def load_ipython_extension(ipython):
    from .notebook.magics import load
    load(ipython)


def unload_ipython_extension(ipython):
    from .notebook.magics import unload
    unload(ipython)
