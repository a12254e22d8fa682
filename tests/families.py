"""Tiny checkpoints of each architecture family nbgrad is tested on, built from configs and saved with
`save_pretrained` (nothing is downloaded)."""
from __future__ import annotations

import pytest
import torch
import transformers as tf

import nbgrad
from nbgrad.models import DEFAULT_MODEL_DIR

VOCAB = 580          # the embedded default tokenizer's size: it is saved beside each text checkpoint
_WIDTH = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
              vocab_size=VOCAB, max_position_embeddings=32, bos_token_id=0, eos_token_id=0, pad_token_id=0)
_HEADS = dict(num_key_value_heads=1, head_dim=8)


def _decoder(config_class, **extra):
    return lambda: config_class(**_WIDTH, **extra)


# family -> (config factory, the block the tests read and edit, as a cell writes it)
FAMILIES = {
    "gpt2": (lambda: tf.GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=VOCAB, n_positions=32,
                                   bos_token_id=0, eos_token_id=0), "model.transformer.h[0]"),
    "llama": (_decoder(tf.LlamaConfig, **_HEADS), "model.model.layers[0]"),
    "qwen2": (_decoder(tf.Qwen2Config, num_key_value_heads=1), "model.model.layers[0]"),
    "qwen3": (_decoder(tf.Qwen3Config, **_HEADS), "model.model.layers[0]"),
    "gemma": (_decoder(tf.GemmaConfig, **_HEADS), "model.model.layers[0]"),
    "gemma2": (_decoder(tf.Gemma2Config, **_HEADS), "model.model.layers[0]"),
    "gemma3": (_decoder(tf.Gemma3TextConfig, **_HEADS), "model.model.layers[0]"),
    "mistral": (_decoder(tf.MistralConfig, **_HEADS), "model.model.layers[0]"),
    "phi3": (_decoder(tf.Phi3Config, num_key_value_heads=1), "model.model.layers[0]"),
    "gpt_neox": (_decoder(tf.GPTNeoXConfig), "model.gpt_neox.layers[0]"),
    "opt": (lambda: tf.OPTConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, ffn_dim=32,
                                 vocab_size=VOCAB, max_position_embeddings=32, word_embed_proj_dim=16,
                                 bos_token_id=0, eos_token_id=0, pad_token_id=0), "model.model.decoder.layers[0]"),
    "bert": (_decoder(tf.BertConfig), "model.bert.encoder.layer[0]"),
    "t5": (lambda: tf.T5Config(d_model=16, d_kv=8, d_ff=32, num_layers=2, num_heads=2, vocab_size=VOCAB,
                               decoder_start_token_id=0, pad_token_id=0, eos_token_id=0),
           "model.encoder.block[0]"),
    "vit": (lambda: tf.ViTConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                 intermediate_size=32, image_size=8, patch_size=4, num_labels=3),
            "model.vit.layers[0]"),
}
ARCHITECTURE = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                "qwen3": "Qwen3ForCausalLM", "gemma": "GemmaForCausalLM", "gemma2": "Gemma2ForCausalLM",
                "gemma3": "Gemma3ForCausalLM", "mistral": "MistralForCausalLM", "phi3": "Phi3ForCausalLM",
                "gpt_neox": "GPTNeoXForCausalLM", "opt": "OPTForCausalLM", "bert": "BertForMaskedLM",
                "t5": "T5ForConditionalGeneration", "vit": "ViTForImageClassification"}


def save_checkpoint(family: str, directory, with_preprocessor: bool = True, seed: int = 0):
    """Build the family's tiny model from its config and save it (and its tokenizer or image processor)."""
    torch.manual_seed(seed)
    model = getattr(tf, ARCHITECTURE[family])(FAMILIES[family][0]())
    model.save_pretrained(directory)
    if with_preprocessor and family == "vit":
        tf.ViTImageProcessor(size={"height": 8, "width": 8}).save_pretrained(directory)
    elif with_preprocessor:
        tf.AutoTokenizer.from_pretrained(str(DEFAULT_MODEL_DIR)).save_pretrained(directory)
    return directory


def model_input(family: str, model):
    """The INPUT the tests trace with: text for decoders and BERT, ids for T5, pixels for ViT."""
    if family == "vit":
        dtype = next(model.parameters()).dtype
        return torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1)).to(dtype)
    if family == "t5":
        ids = nbgrad.tokenizer_for(model)(["Hello World"], return_tensors="pt")["input_ids"]
        return {"input_ids": ids, "decoder_input_ids": ids[:, :3]}
    return "Hello World, how are you"


def call_kwargs(family: str, model, value) -> dict:
    """What the plain-PyTorch oracle passes to the model for the same INPUT."""
    if isinstance(value, str):
        return dict(nbgrad.tokenizer_for(model)(value, return_tensors="pt"))
    if isinstance(value, torch.Tensor):
        return {"pixel_values": value}
    return dict(value)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny matrices: one intra-op thread is many times faster on a machine whose cores are busy."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
