"""A model that changes a module's output in place after the module returned (Falcon adds the attention's output
into its MLP's output; a forward may `t_()` a tensor, set its `.data`, `set_()` it or fill a list it returned).
What the cell makes from that output (a view, an element, a copy, a statistic) is what a plain forward hook makes
at the module's event, never what the value became later: a quiet cell (Program.quiet) defers only statements that
keep values whole, which are the same objects at any time, as the ones a raw hook keeps."""
import pytest
import torch
from torch import nn
from transformers import FalconConfig, FalconForCausalLM

import nbgrad
from nbgrad.engine.compile.compiler import compile_cell
from helpers import hook_count

X = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))


class EditsLater(nn.Module):
    """`a`'s output, consumed by `b`, then changed in place in one of several ways."""
    def __init__(self, how: str):
        super().__init__()
        torch.manual_seed(1)
        self.a, self.b, self.how = nn.Linear(4, 4), nn.Linear(4, 4), how

    def forward(self, x):
        h = self.a(x)
        y = self.b(h)
        if self.how == "add_":
            h.add_(1)
        elif self.how == "t_":
            h.t_()
        elif self.how == "unsqueeze_":
            h.unsqueeze_(0)
        elif self.how == "data":
            h.data = torch.zeros_like(h)
        elif self.how == "set_":
            h.set_(torch.zeros(4, 4))
        return y + h.sum()


class ReturnsList(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x):
        return [self.a(x), x]


class FillsList(nn.Module):
    """`inner` returns a list, and the parent replaces its first element after using it."""
    def __init__(self):
        super().__init__()
        torch.manual_seed(2)
        self.inner, self.b = ReturnsList(), nn.Linear(4, 4)

    def forward(self, x):
        out = self.inner(x)
        y = self.b(out[0])
        out[0] = out[0] * 0
        return y


# cell -> what a plain forward hook on `model.a` makes of the output at its event
MADE = {
    "v = model.a.output[:, 0].save()": lambda o: o[:, 0],
    "h = model.a.output\nv = h[0].save()": lambda o: o[0],
    "v = model.a.output.clone().save()": lambda o: o.clone(),
    "v = model.a.output.mean(-1).save()": lambda o: o.mean(-1),
    "v = [model.a.output[:, 1], model.b.output][0].save()": lambda o: o[:, 1],
    "v = len(model.a.output)": len,
    "v = model.a.output.save()\nw = model.b.output.save()": (WHOLE := lambda o: o),
}


def _at_the_event(model, module, make):
    kept = {}
    handle = module.register_forward_hook(lambda m, args, output: kept.__setitem__("made", make(output)))
    try:
        model(X)
    finally:
        handle.remove()
    return kept["made"]


def _same(found, expected) -> bool:
    if isinstance(expected, torch.Tensor):
        return found.shape == expected.shape and torch.equal(found, expected)
    return found == expected


@pytest.mark.parametrize("how", ["add_", "t_", "unsqueeze_", "data", "set_"])
@pytest.mark.parametrize("cell", sorted(MADE))
def test_what_a_cell_makes_of_an_output_is_made_at_its_event(how, cell):
    model = EditsLater(how)
    expected = _at_the_event(model, model.a, MADE[cell])
    namespace = {"model": model}
    nbgrad.trace(model, X, cell, namespace)
    assert _same(namespace["v"], expected), (how, cell)
    assert hook_count(model) == 0


@pytest.mark.parametrize("cell", ["v = model.inner.output[0].save()",
                                  "v = model.inner.output[0].save()\nw = model.b.output.save()",
                                  "out = model.inner.output\nv = out[0].save()"])
def test_an_element_of_a_list_output_is_the_one_the_module_returned(cell):
    model = FillsList()
    expected = _at_the_event(model, model.inner, lambda output: output[0])
    assert not torch.equal(expected, torch.zeros_like(expected))
    result = nbgrad.trace(model, X, cell)
    assert torch.equal(result.saved["v"], expected) and hook_count(model) == 0


def test_cells_that_keep_values_whole_stay_deferred_and_the_others_do_not():
    assert compile_cell("v = model.a.output.save()\nw = model.b.output.save()").quiet
    assert compile_cell("vs = [b.output.save() for b in model.transformer.h]").quiet
    for cell in (cell for cell in MADE if MADE[cell] is not WHOLE):
        assert compile_cell(cell).direct and not compile_cell(cell).quiet, cell


def _tiny_falcon():
    torch.manual_seed(3)
    config = FalconConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                          parallel_attn=True, new_decoder_architecture=False, alibi=False, bias=False)
    return FalconForCausalLM(config).eval()


FALCON_MADE = {
    "x = model.transformer.h[0].mlp.output.clone().save()": lambda o: o.clone(),
    "x = model.transformer.h[0].mlp.output.mean(-1).save()": lambda o: o.mean(-1),
    "x = model.transformer.h[0].mlp.output[:, -1].save()": lambda o: o[:, -1],
    "xs = [b.mlp.output[:, -1].save() for b in model.transformer.h]\nx = xs[0]": lambda o: o[:, -1],
    "x = model.transformer.h[0].mlp.output.save()": lambda o: o,
}


@pytest.mark.parametrize("cell", sorted(FALCON_MADE))
def test_falcons_mlp_output_is_read_as_a_hook_reads_it_before_the_attention_is_added_into_it(cell):
    """Falcon's block runs `mlp_output += attention_output` after its MLP returned: a copy or a statistic of the MLP's
    output equals a plain hook's, made at the MLP's event; a view or the value itself shows the addition, as the
    hook's own view and value do (they share the tensor's memory)."""
    model = _tiny_falcon()
    ids = torch.tensor([[5, 9, 13, 2, 40, 7]])
    kept = {}

    def keep(module, args, output):
        kept.update(made=FALCON_MADE[cell](output), output=output, copy=output.clone())
    handle = model.transformer.h[0].mlp.register_forward_hook(keep)
    try:
        model(ids)
    finally:
        handle.remove()
    assert not torch.equal(kept["output"], kept["copy"])      # the model did change the output in place
    result = nbgrad.trace(model, ids, cell)
    assert torch.equal(result.saved["x"], kept["made"]) and hook_count(model) == 0
