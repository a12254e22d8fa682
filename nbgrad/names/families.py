"""The families nbgrad knows: for each, where its canonical names live in the model as transformers builds it.

Pure data. Paths from the model (`XForCausalLM`): `embed`, `pos_embed`, `layers`, `ln_final`, `unembed`. Paths
from one block: `ln1`, `attn`, `ln2`, `mlp`; `resid_mid` is the module whose input is the stream after
attention's residual add (None where attention and MLP read the same input: `parallel`, a bool or the config
flag that says so); `attn_out` / `mlp_out` are the output projections (their inputs are `attn.z` and
`mlp.post`); `attention` is the site of the attention function's call in the attention module's forward (its
inputs are q, k, v after rotary; inside it, `pattern` is a site's output). Families that compute attention
in the attention module's own forward (GPT-Neo, BLOOM, Falcon) say instead where each is: `attn_q`, `attn_k`,
`attn_v`, `attn_pattern` are events from the attention module (`source.self__reshape_0.output[0]`), a `ByFlag`
where a config flag picks the forward's branch. `attn_add` / `mlp_add` are the modules whose outputs the block
adds to the stream (`decompose_resid`); `resid_post` is the event of a block that holds the stream it
returns, where the block returns a tuple (`output[0]`; `output` by default). Falcon has no `mlp_add`: its block
adds attention into the MLP's output in place, so that output is not the MLP's own by the time anyone reads it.
A missing key or None: the family has no such thing.
"""
from __future__ import annotations

from typing import NamedTuple


class ByFlag(NamedTuple):
    """A path that depends on a config flag: `on` where `config.<flag>` is true, else `off`."""
    flag: str
    on: str
    off: str


_LLAMA = dict(embed="model.embed_tokens", layers="model.layers", ln_final="model.norm", unembed="lm_head",
              ln1="input_layernorm", attn="self_attn", ln2="post_attention_layernorm", mlp="mlp",
              resid_mid="post_attention_layernorm", attn_out="self_attn.o_proj", mlp_out="mlp.down_proj",
              attention="attention_interface_1", pattern="nn_functional_softmax_0",
              attn_add="self_attn", mlp_add="mlp")

_GEMMA2 = dict(_LLAMA, ln2="pre_feedforward_layernorm", resid_mid="pre_feedforward_layernorm",
               attn_add="post_attention_layernorm", mlp_add="post_feedforward_layernorm")

FAMILIES: dict[str, dict] = {
    "gpt2": dict(embed="transformer.wte", pos_embed="transformer.wpe", layers="transformer.h",
                 ln_final="transformer.ln_f", unembed="lm_head", ln1="ln_1", attn="attn", ln2="ln_2", mlp="mlp",
                 resid_mid="ln_2", attn_out="attn.c_proj", mlp_out="mlp.c_proj", attention="attention_interface_1",
                 pattern="nn_functional_softmax_0", attn_add="attn", mlp_add="mlp"),
    "gpt_neo": dict(resid_post="output[0]", embed="transformer.wte", pos_embed="transformer.wpe",
                    layers="transformer.h",
                    ln_final="transformer.ln_f", unembed="lm_head", ln1="ln_1", attn="attn", ln2="ln_2", mlp="mlp",
                    resid_mid="ln_2", attn_out="attn.attention.out_proj", mlp_out="mlp.c_proj",
                    attn_add="attn", mlp_add="mlp", attn_q="attention.source.self__attn_0.inputs[0][0]",
                    attn_k="attention.source.self__attn_0.inputs[0][1]",
                    attn_v="attention.source.self__attn_0.inputs[0][2]",
                    attn_pattern="attention.source.self__attn_0.source.nn_functional_softmax_0.output"),
    "gptj": dict(embed="transformer.wte", layers="transformer.h", ln_final="transformer.ln_f", unembed="lm_head",
                 ln1="ln_1", attn="attn", mlp="mlp", parallel=True, attn_out="attn.out_proj", mlp_out="mlp.fc_out",
                 attention="attention_interface_1", pattern="nn_functional_softmax_0", attn_add="attn",
                 mlp_add="mlp"),
    "gpt_neox": dict(embed="gpt_neox.embed_in", layers="gpt_neox.layers", ln_final="gpt_neox.final_layer_norm",
                     unembed="embed_out", ln1="input_layernorm", attn="attention", ln2="post_attention_layernorm",
                     mlp="mlp", parallel="use_parallel_residual", resid_mid="post_attention_layernorm",
                     attn_out="attention.dense", mlp_out="mlp.dense_4h_to_h", attention="attention_interface_1",
                     pattern="nn_functional_softmax_0", attn_add="attention", mlp_add="mlp"),
    "opt": dict(embed="model.decoder.embed_tokens", pos_embed="model.decoder.embed_positions",
                layers="model.decoder.layers", ln_final="model.decoder.final_layer_norm", unembed="lm_head",
                ln1="self_attn_layer_norm", attn="self_attn", ln2="final_layer_norm", resid_mid="final_layer_norm",
                attn_out="self_attn.out_proj", mlp_out="fc2", attention="attention_interface_1",
                pattern="nn_functional_softmax_0", attn_add="self_attn", mlp_add="fc2"),
    "bloom": dict(resid_post="output[0]", embed="transformer.word_embeddings", layers="transformer.h",
                  ln_final="transformer.ln_f",
                  unembed="lm_head", ln1="input_layernorm", attn="self_attention", ln2="post_attention_layernorm",
                  mlp="mlp", resid_mid="post_attention_layernorm", attn_out="self_attention.dense",
                  mlp_out="mlp.dense_4h_to_h", attn_q="source.self__reshape_0.output[0]",
                  attn_k="source.self__reshape_0.output[1]", attn_v="source.self__reshape_0.output[2]",
                  attn_pattern="source.F_softmax_0.output"),
    "falcon": dict(resid_post="output[0]", embed="transformer.word_embeddings", layers="transformer.h",
                   ln_final="transformer.ln_f",
                   unembed="lm_head", ln1="input_layernorm", attn="self_attention", mlp="mlp",
                   parallel="parallel_attn", ln2="post_attention_layernorm", resid_mid="post_attention_layernorm",
                   attn_out="self_attention.dense", mlp_out="mlp.dense_4h_to_h", attn_add="self_attention",
                   attn_q=ByFlag("alibi", "source.query_layer_0.output", "source.apply_rotary_pos_emb_0.output[0]"),
                   attn_k=ByFlag("alibi", "source.key_layer_0.output", "source.apply_rotary_pos_emb_0.output[1]"),
                   attn_v="source.value_layer_0.output",
                   attn_pattern=ByFlag("alibi", "source.F_softmax_1.output", "source.F_softmax_0.output")),
    "llama": _LLAMA,
    "mistral": _LLAMA,
    "qwen2": _LLAMA,
    "qwen3": _LLAMA,
    "gemma": _LLAMA,
    "gemma2": _GEMMA2,
    "gemma3_text": _GEMMA2,
    "phi": dict(embed="model.embed_tokens", layers="model.layers", ln_final="model.final_layernorm",
                unembed="lm_head", ln1="input_layernorm", attn="self_attn", mlp="mlp", parallel=True,
                attn_out="self_attn.dense", mlp_out="mlp.fc2", attention="attention_interface_1",
                pattern="nn_functional_softmax_0", attn_add="self_attn", mlp_add="mlp"),
    "phi3": _LLAMA,
}
