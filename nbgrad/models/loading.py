"""Loading models, the tokenizer registry, and the embedded default model."""
from __future__ import annotations

import sys
import weakref
from contextlib import contextmanager
from pathlib import Path

from torch import nn

from ..errors import ArgumentError, NbgradError
from .byid import weakly

DEFAULT_MODEL_DIR = Path(__file__).resolve().parent.parent / "data" / "default"

# Read before every cell: plain dicts by id(model) (see byid.py).
_tokenizers: dict = {}           # id(model) -> (weak reference, tokenizer)
_seen: dict = {}                 # id(model) -> (weak reference,): every model nbgrad has traced or loaded
_processors: "weakref.WeakKeyDictionary[nn.Module, object]" = weakref.WeakKeyDictionary()
# The arguments each model was loaded with: a dataset run on other machines loads it the same way there.
_load_arguments: "weakref.WeakKeyDictionary[nn.Module, tuple]" = weakref.WeakKeyDictionary()


def load_model(name_or_path: str | None = None, **kwargs) -> nn.Module:
    """A `transformers` model of the class its checkpoint names, in eval mode, with its tokenizer (or, for
    an image model, its image processor) remembered; the embedded default with no name. Keywords such as
    `dtype`, `device_map`, `max_memory` and `offload_folder` pass through to `from_pretrained`."""
    path = str(DEFAULT_MODEL_DIR) if name_or_path is None else _checked_name(name_or_path)
    model_class = model_class_for(path, **kwargs)
    with _quiet_progress(name_or_path is None):   # the embedded model loads in milliseconds
        model = model_class.from_pretrained(path, **kwargs)
    model.eval()
    _load_preprocessor(model, path, kwargs)
    remember(model)
    _load_arguments[model] = (name_or_path, dict(kwargs))
    return model


def _checked_name(name_or_path) -> str:
    """A hub name or a folder; a path written as one (`/...`, `./...`, `~/...`) that is not there is said here,
    not as the hub's complaint about the form of a repo id."""
    if not isinstance(name_or_path, (str, Path)):
        raise ArgumentError(f"load_model takes a hub name ('gpt2', 'org/name') or the path of a checkpoint's "
                            f"folder, not {type(name_or_path).__name__}")
    text = str(name_or_path)
    local = isinstance(name_or_path, Path) or text.startswith(("/", "./", "../", "~", ".\\")) or "\\" in text
    if local and not Path(text).expanduser().exists():
        raise NbgradError(f"load_model: there is no folder {text!r}: give the folder that save_pretrained wrote "
                          f"(config.json and the weights), or a hub name ('gpt2', 'org/name')")
    return str(Path(text).expanduser()) if local else text


def no_tokenizer_message(model: nn.Module) -> str:
    """Why a text INPUT cannot be run, and what to do: the checkpoint `load_model` read had no tokenizer, or
    the model did not come from `load_model`."""
    loaded = _load_arguments.get(model)
    if loaded is not None and loaded[0] is not None:
        return (f"a text INPUT needs a tokenizer, and nbgrad.load_model({loaded[0]!r}) found none saved with the "
                f"model: save one there (`tokenizer.save_pretrained(...)`), pass --tokenizer EXPR, or give INPUT "
                f"as token ids (a tensor)")
    return ("a text INPUT needs a tokenizer: load the model with nbgrad.load_model, pass --tokenizer EXPR, or "
            "give the model a `tokenizer` attribute")


def load_arguments(model: nn.Module):
    """(name_or_path, keywords) that `load_model` was called with for this model, or None."""
    return _load_arguments.get(model)


def model_class_for(path: str, **kwargs) -> type:
    """The class `config.architectures` names (masked LM, encoder-decoder, image classifier, ...);
    transformers' causal-LM auto class when the config names none that transformers knows."""
    import transformers
    config = transformers.AutoConfig.from_pretrained(path, **_hub_options(kwargs))
    for name in getattr(config, "architectures", None) or ():
        candidate = getattr(transformers, str(name), None)
        if isinstance(candidate, type) and issubclass(candidate, transformers.PreTrainedModel):
            return candidate
    return transformers.AutoModelForCausalLM


# Keywords of `from_pretrained` that also say where the tokenizer, processor and config come from.
_HUB_OPTIONS = ("revision", "token", "cache_dir", "local_files_only", "trust_remote_code", "subfolder")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt", "tokenizer.model",
                    "spiece.model", "sentencepiece.bpe.model")


def _hub_options(kwargs: dict) -> dict:
    return {key: kwargs[key] for key in _HUB_OPTIONS if key in kwargs}


@contextmanager
def _quiet_progress(quiet: bool):
    from transformers.utils import logging as transformers_logging
    quiet = quiet and transformers_logging.is_progress_bar_enabled()
    if quiet:
        transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if quiet:
            transformers_logging.enable_progress_bar()


def _load_preprocessor(model: nn.Module, path: str, kwargs: dict) -> None:
    """Remember the checkpoint's image processor (image models) or tokenizer (the rest), when it has one."""
    if getattr(model, "main_input_name", "input_ids") == "pixel_values":
        processor = _optional("image processor", "AutoImageProcessor", path, ("preprocessor_config.json",),
                              kwargs, "give INPUT as a pixel_values tensor")
        if processor is not None:
            _processors[model] = processor
        return
    tokenizer = _optional("tokenizer", "AutoTokenizer", path, _TOKENIZER_FILES, kwargs,
                          "a text INPUT needs --tokenizer EXPR; tensor and dict INPUTs work")
    if tokenizer is not None:
        if tokenizer.pad_token is None and tokenizer.eos_token is not None:
            tokenizer.pad_token = tokenizer.eos_token
        register_tokenizer(model, tokenizer)


def _optional(kind: str, loader: str, path: str, files: tuple, kwargs: dict, remedy: str):
    """`loader.from_pretrained(path)`, or None with a one-line note when the checkpoint has no `kind`."""
    import transformers
    folder = Path(path) / kwargs.get("subfolder", "")
    if Path(path).is_dir() and not any((folder / name).exists() for name in files):
        _note(f"{path} has no {kind} saved with it; it loads without one ({remedy}).")
        return None
    try:
        return getattr(transformers, loader).from_pretrained(path, **_hub_options(kwargs))
    except (OSError, ValueError, ImportError, KeyError) as error:
        reason = (str(error).strip().splitlines() or [""])[0][:160]
        _note(f"no {kind} could be loaded for {path} ({type(error).__name__}: {reason}); "
              f"it loads without one ({remedy}).")
        return None


def _note(text: str) -> None:
    print(f"nbgrad: {text}", file=sys.stderr)


def register_tokenizer(model: nn.Module, tokenizer) -> None:
    _tokenizers[id(model)] = (weakly(model, _tokenizers), tokenizer)
    remember(model)


def tokenizer_for(model: nn.Module):
    """The tokenizer nbgrad knows for this model (registered, or its `tokenizer` attribute), or None."""
    entry = _tokenizers.get(id(model))
    if entry is not None and entry[0]() is model and entry[1] is not None:
        return entry[1]
    return getattr(model, "tokenizer", None)


def processor_for(model: nn.Module):
    """The image processor `load_model` found saved with an image model's checkpoint, or None."""
    return _processors.get(model)


def remember(model: nn.Module) -> None:
    entry = _seen.get(id(model))
    if entry is None or entry[0]() is not model:
        _seen[id(model)] = (weakly(model, _seen),)


def models_seen() -> list:
    return [model for model in (entry[0]() for entry in list(_seen.values())) if model is not None]
