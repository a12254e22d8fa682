"""Models and what feeds them: loading and the tokenizer registry (`loading`), INPUT -> call arguments
(`inputs`), invokes -> one padded batch (`batching`), a model's vocabulary and position limits (`limits`),
what every driver does before a run (`cell`), and caches by model that cost no Python call (`byid`).

Why a folder: placement, padding and tokenizers are transformers' world, not the engine's; the engine works
on whatever module tree and call arguments it is given and never moves a tensor itself."""
from .loading import (DEFAULT_MODEL_DIR, load_model, models_seen, processor_for, register_tokenizer, remember,
                      tokenizer_for)

__all__ = ["DEFAULT_MODEL_DIR", "load_model", "models_seen", "processor_for", "register_tokenizer", "remember",
           "tokenizer_for"]
