"""Every cell form of the tutorials (examples/*.ipynb: their %%trace and %%generate cells, the same statements),
written once for any model: BLOCKS, EMBED, HEAD, ATTN, ROOT, BLOCK0 and GLOB stand for the model's own paths.
(A %%backward cell runs on a tensor of the notebook, not on a model: there is nothing to scan.)"""
import torch
import transformers as tf

import nbgrad
from nbgrad.models.loading import register_tokenizer

PATHS = {
    "gpt2": {"BLOCKS": "model.transformer.h", "EMBED": "model.transformer.wte", "HEAD": "model.lm_head",
             "ATTN": "attn", "BLOCK0": "transformer.h.0", "ROOT": "transformer", "GLOB": "transformer.h.*"},
    "llama": {"BLOCKS": "model.model.layers", "EMBED": "model.model.embed_tokens", "HEAD": "model.lm_head",
              "ATTN": "self_attn", "BLOCK0": "model.layers.0", "ROOT": "model", "GLOB": "model.layers.*"},
}

GRADIENT = "loss = model.output.logits[0, -1, target]\nwith loss.backward():\n"
# (id, INPUT's name in the namespace or None, body, options): 01 to 12 in the tutorials' order
TRACE_CELLS = [
    ("reads in a loop", "prompt", "hidden = [BLOCKS[i].output.save() for i in range(2)]\n"
                                  "logits = model.output.logits.save()\n", {}),
    ("a list of prompts", "prompts", "hidden = [BLOCKS[i].output.save() for i in range(2)]\n", {}),
    ("a gradient", "prompt", "hs = BLOCKS[1].output.save()\n" + GRADIENT + "    g = hs.grad.save()\n", {}),
    ("gradient edits", "prompt", "h2 = BLOCKS[1].output\nh0 = BLOCKS[0].output\n" + GRADIENT +
     "    before = h2.grad.clone().save()\n    h2.grad[:] = 0\n    early = h0.grad.save()\n", {}),
    ("a gradient replaced", "prompt", "h2 = BLOCKS[1].output\nh0 = BLOCKS[0].output\n" + GRADIENT +
     "    h2.grad = h2.grad * 0.5\n    half = h0.grad.save()\nmodel.zero_grad(set_to_none=True)\n", {}),
    ("item of a gradient", "prompt", "outs = [BLOCKS[i].output for i in range(2)]\n" + GRADIENT +
     "    norms = [outs[i].grad.norm().item() for i in range(2)]\nlast = outs[1].save()\n", {}),
    ("two passes", "prompt", "hs = BLOCKS[1].output\nlogits = model.output.logits\n"
                             "with logits[0, -1, target].backward(retain_graph=True):\n    first = hs.grad.save()\n"
                             "with (2 * logits[0, -1, target]).backward():\n    second = hs.grad.save()\n", {}),
    ("requires_grad_", "prompt", "hs = BLOCKS[1].output.requires_grad_(True).save()\n"
                                 "logits = model.output.logits.save()\n", {}),
    ("retain_grad", "prompt", "hs = BLOCKS[1].output.save()\nhs.retain_grad()\n"
                              "model.output.logits[0, -1, target].backward()\n", {}),
    ("embeddings' gradient", "prompt", "emb = EMBED.output.save()\n" + GRADIENT + "    emb_grad = emb.grad.save()\n",
     {}),
    ("no grad", "prompt", "italy = BLOCKS[1].output[0, -1].save()\n", {"no_grad": True}),
    ("invokes", None, "with invoke(clean):\n    clean_act = BLOCKS[1].output[:, -1].save()\n"
                      "    clean_logits = HEAD.output.save()\nwith invoke(corrupt):\n"
                      "    BLOCKS[1].output[:, -1] = clean_act\n    patched_logits = HEAD.output.save()\n", {}),
    ("three invokes", None, "with invoke(clean):\n    a = BLOCKS[1].output[:, -1].save()\nwith invoke(corrupt):\n"
                            "    b = BLOCKS[1].output[:, -1].save()\nwith invoke(corrupt):\n"
                            "    BLOCKS[1].output[:, -1] += 2.0 * (a - b)\n    steered = HEAD.output[:, -1].save()\n",
     {}),
    ("cache", "prompt", "c = cache()\n", {}),
    ("cache with grads", "prompt", "g = cache('GLOB', grads=True)\nmodel.output.logits[0, -1].max().backward()\n",
     {}),
    ("cache of the notebook's modules", "prompt", "g = cache(blocks, grads=True)\n"
                                                  "model.output.logits[0, -1].max().backward()\n", {}),
    ("a gradient after a backward call", "prompt", "h = BLOCKS[1].output\nmodel.output.logits[0, -1].max().backward()\n"
                                                   "grad = h.grad.save()\n", {}),
    ("loops over modules", "prompt", "backwards = [b.output.save() for b in reversed(BLOCKS)]\n"
                                     "outer = {n: m.output.save() for n, m in model.named_modules() "
                                     "if n in ('ROOT', 'BLOCK0')}\n", {}),
    ("stop", "prompt", "early = cache()\nfirst = BLOCKS[0].output.save()\nstop()\n", {}),
    ("sites and their gradient", "prompt",
     "attn = BLOCKS[0].ATTN.source.attention_interface_1\n"
     "pattern = attn.source.nn_functional_softmax_0.output.save()\nlogits = model.output.logits.save()\n"
     "with logits[0, -1].max().backward():\n    grad = pattern.grad.save()\nattribution = (pattern * grad).save()\n",
     {}),
    ("a site edited", "prompt", "pattern = BLOCKS[0].ATTN.source.attention_interface_1.source."
                                "nn_functional_softmax_0.output\npattern[:, 1] = 0\n"
                                "ablated = model.output.logits.save()\n", {"no_grad": True}),
    ("skip", "prompt", "BLOCKS[1].skip(BLOCKS[1].input)\nh = BLOCKS[1].output.save()\n"
                       "logits = model.output.logits.save()\n", {}),
    ("over a dataset", None, "act = BLOCKS[1].output[:, -1].save()\n",
     {"over": "table", "batch_size": 2, "no_grad": True}),
    ("over a dataset, gradients", None, "grad = BLOCKS[1].output.grad[:, -1].save()\n"
                                        "HEAD.output[:, -1].max().backward()\n", {"over": "table", "batch_size": 2}),
    ("batched patching", None, "diffs = {}\nfor layer in range(n_layers):\n    for pos in range(n_pos):\n"
                               "        with invoke(corrupt):\n"
                               "            BLOCKS[layer].output[:, pos] = acts[layer][:, pos]\n"
                               "            logits = HEAD.output[0, -1]\n"
                               "            diffs[layer, pos] = (logits[answer] - logits[wrong]).save()\n",
     {"no_grad": True}),
    ("canonical names", "ids", "resid = [model.layers[i].resid_post[0, -1].save() for i in range(model.n_layers)]\n"
                               "c = cache(names='canonical')\nlogits = model.logits[0, -1].save()\n", {}),
    ("canonical cache with grads", "prompt", "cc = cache('layers.*', names='canonical', grads=True)\n"
                                             "model.logits[0, -1].max().backward()\n", {}),
    ("canonical pattern edited", "prompt", "same = model.layers[0].attn.pattern.save()\n"
                                           "q = model.layers[0].attn.q.save()\nmodel.layers[0].attn.pattern[:, 1] = 0\n"
                                           "canonical_ablated = model.logits.save()\n", {"no_grad": True}),
    ("canonical values", "prompt", "p = model.layers[0].attn.pattern.save()\nq = model.layers[1].attn.q.save()\n"
                                   "with model.logits[0, -1].max().backward():\n"
                                   "    g = model.layers[0].resid_mid.grad.save()\n", {}),
]
GENERATE_CELLS = [
    ("generation", "prompt", "top = model.output.logits[:, -1].argmax(-1).save()\n"
                             "last_block = BLOCKS[-1].output.save()\n", {"out": "ids"}),
    ("steered generation", "prompt", "if step >= k:\n    BLOCKS[1].output[:, -1] += direction\n"
                                     "steered_logits = model.output.logits[:, -1].save()\n", {}),
    ("generation with invokes", None, "with invoke(prompt):\n    if step >= k:\n"
                                      "        BLOCKS[1].output[:, -1] += direction\n"
                                      "with invoke(other):\n    other_top = model.output.logits[:, -1].argmax(-1).save()\n",
     {}),
]


def for_model(source: str, family: str) -> str:
    for name, path in PATHS[family].items():
        source = source.replace(name, path)
    return source


def build(family: str):
    """The embedded model (eager attention, for sites), or a Llama-shaped model from a config with the embedded
    tokenizer (its vocabulary's size)."""
    embedded = nbgrad.load_model(attn_implementation="eager")
    if family == "gpt2":
        return embedded
    torch.manual_seed(0)
    config = tf.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            intermediate_size=64, vocab_size=embedded.config.vocab_size, max_position_embeddings=64,
                            attn_implementation="eager")
    llama = tf.LlamaForCausalLM(config).eval()
    register_tokenizer(llama, nbgrad.tokenizer_for(embedded))
    return llama


def namespace(model) -> dict:
    """What the tutorials bind before their cells, for this model."""
    tokenizer = nbgrad.tokenizer_for(model)
    width = model.get_input_embeddings().embedding_dim
    generator = torch.Generator().manual_seed(0)
    names = {"model": model, "torch": torch, "prompt": "The Eiffel Tower is in the city of",
             "other": "The capital of Italy is", "prompts": ["The Eiffel Tower is in the city of", "Hi there"],
             "clean": "The Eiffel Tower is in", "corrupt": "The Colosseum is in", "target": 5, "answer": 3, "wrong": 4,
             "k": 1, "n_layers": 2, "n_pos": 2, "direction": torch.randn(width, generator=generator),
             "table": ["The cat sat", "Paris is the capital of", "One, two,"],
             "ids": tokenizer("The Eiffel Tower is", return_tensors="pt").input_ids,
             "blocks": model.transformer.h if hasattr(model, "transformer") else model.model.layers}
    length = tokenizer(names["clean"], return_tensors="pt").input_ids.shape[1]
    names["acts"] = [torch.randn(1, length, width, generator=generator) for _ in range(2)]    # a clean run's blocks
    return names
