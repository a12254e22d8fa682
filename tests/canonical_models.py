"""Tiny models of every family in nbgrad.names.FAMILIES, built from configs (nothing is downloaded), and the
plain-PyTorch oracles the canonical-name tests compare with: hooks on the real paths, and an attention
function of the test's own (registered with transformers' AttentionInterface) for q, k, v and patterns."""
from __future__ import annotations

import sys

import torch
import transformers as tf
from transformers import masking_utils

_SMALL = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32, vocab_size=64,
              max_position_embeddings=32, bos_token_id=0, eos_token_id=0, pad_token_id=0)
_GQA = dict(num_key_value_heads=1, head_dim=8)

BUILDERS = {
    "gpt2": lambda: tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=64, n_positions=32)),
    "gpt_neo": lambda: tf.GPTNeoForCausalLM(tf.GPTNeoConfig(
        hidden_size=16, num_layers=2, num_heads=2, vocab_size=64, max_position_embeddings=32,
        attention_types=[[["global", "local"], 1]], intermediate_size=32)),
    "gptj": lambda: tf.GPTJForCausalLM(tf.GPTJConfig(n_embd=16, n_layer=2, n_head=2, vocab_size=64, n_positions=32,
                                                    rotary_dim=4)),
    "gpt_neox": lambda: tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(**_SMALL)),
    "opt": lambda: tf.OPTForCausalLM(tf.OPTConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                                  ffn_dim=32, vocab_size=64, max_position_embeddings=32,
                                                  word_embed_proj_dim=16)),
    "bloom": lambda: tf.BloomForCausalLM(tf.BloomConfig(hidden_size=16, n_layer=2, n_head=2, vocab_size=64)),
    "falcon": lambda: tf.FalconForCausalLM(tf.FalconConfig(hidden_size=16, num_hidden_layers=2,
                                                           num_attention_heads=2, vocab_size=64)),
    "llama": lambda: tf.LlamaForCausalLM(tf.LlamaConfig(**_SMALL, **_GQA)),
    "mistral": lambda: tf.MistralForCausalLM(tf.MistralConfig(**_SMALL, **_GQA)),
    "qwen2": lambda: tf.Qwen2ForCausalLM(tf.Qwen2Config(**_SMALL, num_key_value_heads=1)),
    "qwen3": lambda: tf.Qwen3ForCausalLM(tf.Qwen3Config(**_SMALL, **_GQA)),
    "gemma": lambda: tf.GemmaForCausalLM(tf.GemmaConfig(**_SMALL, **_GQA)),
    "gemma2": lambda: tf.Gemma2ForCausalLM(tf.Gemma2Config(**_SMALL, **_GQA)),
    "gemma3_text": lambda: tf.Gemma3ForCausalLM(tf.Gemma3TextConfig(**_SMALL, **_GQA)),
    "phi": lambda: tf.PhiForCausalLM(tf.PhiConfig(**_SMALL)),
    "phi3": lambda: tf.Phi3ForCausalLM(tf.Phi3Config(**_SMALL, num_key_value_heads=1)),
}
IDS = torch.tensor([[3, 14, 15, 9, 26, 5]])


def build(family: str):
    torch.manual_seed(0)
    model = BUILDERS[family]().eval()
    for parameter in model.parameters():        # initialised small: make every value and gradient visible
        parameter.data.normal_(0, 0.3, generator=torch.Generator().manual_seed(parameter.numel()))
    return model


def first(value):
    return value[0] if isinstance(value, tuple) else value


def hooked_run(model, forward: dict = None, pre: dict = None, ids=IDS):
    """The model's output with `forward` hooks (path -> hook(module, args, output)) and `pre` hooks (path ->
    hook(module, args, kwargs)) registered the plain PyTorch way, every one removed afterwards."""
    handles = [model.get_submodule(path).register_forward_hook(hook) for path, hook in (forward or {}).items()]
    handles += [model.get_submodule(path).register_forward_pre_hook(hook, with_kwargs=True)
                for path, hook in (pre or {}).items()]
    try:
        return model(ids)
    finally:
        for handle in handles:
            handle.remove()


class AttentionProbe:
    """The family's own eager attention function, registered under a name of the test's and used instead of
    the model's: it records q, k, v as passed in and the pattern it returns, and may edit them first."""

    def __init__(self, model, edit=None):
        self.model, self.edit, self.seen = model, edit, []
        attention = next(m for m in model.modules() if type(m).__name__.endswith("Attention"))
        self.eager = sys.modules[type(attention).__module__].eager_attention_forward

    def __call__(self, module, query, key, value, *args, **kwargs):
        if self.edit:
            self.edit(module, query, key, value)
        output, pattern = self.eager(module, query, key, value, *args, **kwargs)
        self.seen.append(dict(q=query.detach().clone(), k=key.detach().clone(), v=value.detach().clone(),
                              pattern=pattern.detach().clone()))
        return output, pattern

    def run(self, ids=IDS):
        tf.AttentionInterface.register("nbgrad_test_probe", self)
        masking_utils.AttentionMaskInterface.register("nbgrad_test_probe", masking_utils.eager_mask)
        before = self.model.config._attn_implementation
        self.model.set_attn_implementation("nbgrad_test_probe")
        try:
            return self.model(ids)
        finally:
            self.model.set_attn_implementation(before)
