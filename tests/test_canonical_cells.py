"""One cell text on several families, canonical names in every cell form (invokes, %%generate, --over,
cache(...)), and the errors a canonical name can meet: each checked against plain PyTorch or for its message."""
import pytest
import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

import nbgrad
from nbgrad.errors import NbgradError
from nbgrad.names import FAMILIES, register
from canonical_models import IDS, build, hooked_run

SAME_CELL = """
r = [model.layers[i].resid_post.save() for i in range(model.n_layers)]
model.layers[1].attn.pattern[:, 1] = 0                       # ablate head 1 of layer 1
with model.logits[0, -1].max().backward():
    g = model.layers[0].resid_pre.grad.save()
"""


def _first(value):
    return value[0] if isinstance(value, tuple) else value


@pytest.mark.parametrize("family", ["gpt2", "llama", "qwen2", "gpt_neox"])
def test_the_same_cell_runs_on_gpt2_llama_qwen_and_pythia_shapes(family):
    model = build(family)
    namespace = {"model": model}
    nbgrad.trace(model, IDS, SAME_CELL, namespace)
    entry, seen = FAMILIES[family], {"r": []}
    blocks = [f"{entry['layers']}.{i}" for i in range(model.config.num_hidden_layers)]

    def zero_head(module, args, kwargs):
        z = args[0].unflatten(-1, (2, -1)).clone()
        z[:, :, 1] = 0
        return (z.flatten(-2), *args[1:]), kwargs
    forward = {block: (lambda m, a, o: seen["r"].append(_first(o).detach()) and None) for block in blocks}
    pre = {f"{blocks[1]}.{entry['attn_out']}": zero_head,
           blocks[0]: lambda m, a, k: (a[0] if a else k["hidden_states"]).register_hook(
               lambda grad: seen.__setitem__("g", grad)) and None}
    model.zero_grad()
    hooked_run(model, forward, pre).logits[0, -1].max().backward()
    for got, want in zip(namespace["r"], seen["r"], strict=True):
        torch.testing.assert_close(got.detach(), want)
    torch.testing.assert_close(namespace["g"], seen["g"])
    assert model.config._attn_implementation == "sdpa"      # the eager switch was given back


def test_invokes_see_their_own_rows_through_canonical_names():
    model = build("llama")
    other = torch.tensor([[7, 8, 9, 10, 11, 12]])
    namespace = {"model": model, "a_ids": IDS, "b_ids": other}
    nbgrad.trace(model, None, "with invoke(a_ids):\n    a = model.layers[1].resid_post.save()\n"
                              "with invoke(b_ids):\n    model.layers[0].resid_mid[:] = 0\n"
                              "    b = model.logits.save()", namespace, no_grad=True)
    with torch.no_grad():
        torch.testing.assert_close(namespace["a"], _block_output(model, IDS, "model.layers.1"))
        zeroed = hooked_run(model, pre={"model.layers.0.post_attention_layernorm":
                                        lambda m, a, k: (a[0].zero_(), None)[1]}, ids=other).logits
    torch.testing.assert_close(namespace["b"], zeroed)


def _block_output(model, ids, path):
    seen = []
    with torch.no_grad():
        hooked_run(model, {path: lambda m, a, o: seen.append(_first(o)) and None}, ids=ids)
    return seen[0]


def test_generate_reads_canonical_logits_at_every_step():
    model = build("qwen2")
    result = nbgrad.generate(model, IDS, "top = model.logits[:, -1].argmax(-1).save()", max_new_tokens=3)
    tokens = model.generate(IDS, max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert [int(t) for t in result.saved["top"]] == tokens[0, IDS.shape[1]:].tolist()


def test_over_a_dataset_reads_canonical_names_per_example():
    model = build("gpt_neox")
    examples = [IDS, torch.tensor([[1, 2, 3, 4, 5, 6]])]
    namespace = {"model": model}
    nbgrad.trace(model, None, "h = model.layers[1].resid_post[:, -1].save()", namespace, over=examples,
                 batch_size=2, progress=False)
    for example, got in zip(examples, namespace["h"], strict=True):
        torch.testing.assert_close(got, _block_output(model, example, "gpt_neox.layers.1")[:, -1])


def test_cache_takes_canonical_modules():
    model = build("gpt2")
    namespace = {"model": model}
    nbgrad.trace(model, IDS, "c = cache([model.layers[0].attn, model.layers[1].mlp])", namespace, no_grad=True)
    assert list(namespace["c"]) == ["transformer.h.0.attn", "transformer.h.1.mlp"]


@pytest.mark.parametrize("cell, family, words", [
    ("x = model.pos_embed.output.save()", "llama", ["llama family has no pos_embed", "no learned positions"]),
    ("x = model.layers[0].resid_mid.save()", "gptj", ["gptj family has no resid_mid", "in parallel"]),
    ("x = model.layers[0].ln2.output.save()", "falcon", ["falcon family has no ln2", "in parallel"]),
    ("\nx = model.layers[0].resid_pots.save()", "gpt2", ["line 2", "canonical names: model.layers[0].resid_pots is not a canonical name",
                                                        "nearest: resid_post, resid_pre"]),
    ("x = model.layers[0].attn.patern.save()", "llama", ["nearest: pattern"]),
    ("model.layers[0].attn.head_out = 0", "gpt2", ["computed from attn.z", "write attn.z instead"]),
    ("x = model.layers[0].mlp.output.save()", "opt",
     ["model.layers[0].mlp.output: the opt family has no MLP module of its own; its MLP layers sit in the block "
      "itself, so name them by the model's own paths"]),
    ("model.layers[1].mlp.output[:] = 0", "opt", ["model.layers[1].mlp.output: the opt family has no MLP module of "
                                                 "its own; its MLP layers sit in the block itself, so name them"]),
])
def test_errors_say_what_the_family_lacks_or_what_was_meant(cell, family, words):
    model = build(family)
    with pytest.raises(NbgradError) as error:
        nbgrad.trace(model, IDS, cell, {"model": model}, no_grad=True)
    for word in words:
        assert word in str(error.value)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


class NoAttentionFunction(GPT2LMHeadModel):
    """GPT-2, registered as a family whose attention nbgrad cannot open."""


def test_a_family_without_an_attention_function_has_no_q_and_says_so():
    register(NoAttentionFunction, {k: v for k, v in FAMILIES["gpt2"].items() if k not in ("attention", "pattern")})
    model = NoAttentionFunction(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=64, n_positions=16))
    with pytest.raises(NbgradError, match=r"gpt2 family has no attn\.q \(its attention is computed its own way"):
        nbgrad.trace(model, IDS, "x = model.layers[0].attn.q.save()", {"model": model}, no_grad=True)


class Tiny(nn.Module):
    """A model of one's own: two residual blocks of two linear maps."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.ModuleDict({"norm": nn.LayerNorm(4), "ff": nn.Linear(4, 4)}) for _ in range(2))
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        for block in self.blocks:
            x = x + block["ff"](block["norm"](x))
        return self.head(x)


def test_an_unknown_family_names_itself_and_how_to_register_then_registering_works():
    model = Tiny()
    x = torch.randn(1, 4)
    with pytest.raises(NbgradError) as error:
        nbgrad.trace(model, x, "y = model.layers[0].ln1.output.save()", {"model": model})
    assert "does not know the family 'Tiny' (Tiny)" in str(error.value)
    assert "nbgrad.names.register(Tiny, {'layers': ..." in str(error.value)
    register(Tiny, {"layers": "blocks", "ln1": "norm", "unembed": "head"})
    namespace = {"model": model}
    nbgrad.trace(model, x, "y = model.layers[1].ln1.output.save()\nout = model.unembed.input.save()", namespace)
    seen = []
    handle = model.blocks[1]["norm"].register_forward_hook(lambda m, a, o: seen.append(o))
    try:
        with torch.no_grad():
            model(x)
    finally:
        handle.remove()
    torch.testing.assert_close(namespace["y"].detach(), seen[0])
    assert namespace["out"].shape == (1, 4)


def test_the_names_magic_prints_each_canonical_name_beside_its_real_path(shell):
    from IPython.utils.capture import capture_output
    shell.user_ns["llama"] = build("llama")
    with capture_output() as printed:
        assert shell.run_cell("%names llama").success
    lines = printed.stdout.splitlines()
    assert lines[0] == "llama: LlamaForCausalLM, family 'llama', 2 layers"
    assert any(line.split() == ["llama.layers[i].resid_mid", "llama.model.layers[i].post_attention_layernorm.input"]
               for line in lines)
    assert any(line.split()[0] == "llama.pos_embed" and "no learned positions" in line for line in lines)
    assert "%names MODEL: give a model" in str(shell.run_cell("%names").error_in_exec)


def test_the_trace_magic_takes_canonical_names_with_and_without_over(shell):
    model = build("llama")
    shell.user_ns.update(tiny_llama=model, ids=IDS, examples=[IDS, torch.tensor([[1, 2, 3, 4, 5, 6]])])
    result = shell.run_cell("%%trace tiny_llama ids -q\nh = tiny_llama.layers[1].resid_mid.save()")
    assert result.success, result.error_in_exec
    torch.testing.assert_close(shell.user_ns["h"].detach(), _block_input(model, IDS))
    result = shell.run_cell("%%trace tiny_llama --over examples --batch-size 2\n"
                            "p = tiny_llama.layers[0].attn.pattern.save()")
    assert result.success, result.error_in_exec
    assert [tuple(p.shape) for p in shell.user_ns["p"]] == [(1, 2, 6, 6)] * 2
    assert model.config._attn_implementation == "sdpa"


def _block_input(model, ids):
    seen = []
    with torch.no_grad():
        hooked_run(model, pre={"model.layers.1.post_attention_layernorm":
                               lambda m, a, k: seen.append(a[0].clone()) and None}, ids=ids)
    return seen[0]


def test_a_cell_without_canonical_names_is_left_as_it_is():
    from nbgrad.names import canonical_source, mentions_canonical
    for family, cell in (("gpt2", "h = model.transformer.h[0].output.save()\nl = model.output.logits.save()"),
                         ("llama", "h = model.model.layers[0].output.save()")):
        model = build(family)
        assert not mentions_canonical(cell)
        assert canonical_source(cell, model, {"model": model}) is cell


def test_after_an_error_the_eager_switch_and_hooks_are_given_back():
    model = build("qwen3")
    with pytest.raises(ZeroDivisionError):
        nbgrad.trace(model, IDS, "p = model.layers[0].attn.pattern.save()\nx = 1 / 0", {"model": model})
    assert model.config._attn_implementation == "sdpa"
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    namespace = {"model": model}
    nbgrad.trace(model, IDS, "h = model.layers[1].resid_post.save()", namespace, no_grad=True)
    torch.testing.assert_close(namespace["h"], _block_output(model, IDS, "model.layers.1"))


def test_generate_reads_patterns_with_eager_attention_and_gives_the_switch_back():
    model = build("llama")
    result = nbgrad.generate(model, IDS, "p = model.layers[0].attn.pattern[:, :, -1].save()", max_new_tokens=2)
    assert [tuple(p.shape) for p in result.saved["p"]] == [(1, 2, 6), (1, 2, 7)]
    assert all(torch.allclose(p.sum(-1), torch.ones(1, 2)) for p in result.saved["p"])
    assert model.config._attn_implementation == "sdpa"


def test_a_name_bound_to_a_block_and_enumerate_over_the_layers_take_canonical_names():
    model = build("gpt_neox")
    namespace = {"model": model}
    nbgrad.trace(model, IDS, "block = model.layers[1]\nh = block.resid_post.save()\n"
                             "outs = {i: b.resid_post.save() for i, b in enumerate(reversed(model.layers))}",
                 namespace, no_grad=True)
    want = _block_output(model, IDS, "gpt_neox.layers.1")
    torch.testing.assert_close(namespace["h"], want)
    torch.testing.assert_close(namespace["outs"][0], want)


def test_ray_batches_carry_the_attention_the_notebook_model_runs_the_cell_with(default_model):
    """Without a cluster: what --engine ray sends each worker, and the switch a worker makes with it."""
    from nbgrad.datasets.ray_engine import RayBatches
    from nbgrad.names.rewrite import attention_as, eager_attention
    source = "p = model.transformer.h[0].attn.source.attention_interface_1.source.nn_functional_softmax_0.output.save()"
    with eager_attention(default_model):
        assert RayBatches(default_model, source, {"model": default_model}, True, 2, None).attention == "eager"
    assert RayBatches(default_model, source, {"model": default_model}, True, 2, None).attention == "sdpa"
    worker_model = nbgrad.load_model()
    with pytest.raises(ZeroDivisionError):
        with attention_as(worker_model, "eager"):
            assert worker_model.config._attn_implementation == "eager"
            1 / 0
    assert worker_model.config._attn_implementation == "sdpa"
