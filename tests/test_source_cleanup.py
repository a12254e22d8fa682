"""`M.source` errors and clean-up: after every cell, errors and interrupts included, the module's class and
instance are as before (no instance forward, no hooks), and the next cell works."""
import pytest
import torch
from torch import nn

import nbgrad
from helpers import hook_count
from interrupts import Injector, points
from sitemodels import FAMILIES
from nbgrad.engine.run import runtime


def fresh():
    return FAMILIES["gpt2"][0](), FAMILIES["gpt2"][4]


def assert_clean(model, forwards):
    assert [type(m).__dict__.get("forward") for m in model.modules()] == forwards, "a class forward changed"
    assert not [m for m in model.modules() if "forward" in vars(m)], "an instance forward stayed"
    assert hook_count(model) == 0, "hooks stayed"


def class_forwards(model):
    return [type(m).__dict__.get("forward") for m in model.modules()]


def site_error(cell: str) -> str:
    """The message of the nbgrad error `cell` raises on a fresh model, which the error leaves as it found it."""
    model, ids = fresh()
    forwards = class_forwards(model)
    with pytest.raises(nbgrad.NbgradError) as caught:
        nbgrad.trace(model, ids, cell, namespace={"model": model})
    assert_clean(model, forwards)
    return str(caught.value)


def test_an_unknown_site_lists_the_nearest_names():
    message = site_error("x = model.transformer.h[0].attn.source.self_c_attn_2.output.save()")
    assert "line 1: GPT2Attention.source has no site 'self_c_attn_2'" in message
    assert "self_c_attn_0" in message and "self_c_attn_1" in message


def test_a_softmax_asked_of_an_attention_module_points_at_its_attention_function():
    message = site_error("p = model.transformer.h[0].attn.source.softmax_0.output.save()")
    assert message.endswith("The attention pattern is computed in the function attention_interface_1 calls: "
                            "attention_interface_1.source.nn_functional_softmax_0 (with "
                            "attn_implementation=\"eager\")")


@pytest.mark.parametrize("cell, says", [
    ("x = model.transformer.h.source.output", "line 1: ModuleList.source has no site 'output'"),
    ("x = 1\nx = model.transformer.h[0].attn.source.self_c_attn_1.source.x.output.save()",
     "line 2: GPT2Attention.source.self_c_attn_1.source: self_c_attn_1 calls a module (Conv1D); use that module's "
     "own `.source`"),
])
def test_a_site_error_names_the_line(cell, says):
    """Raised by the cell's own code (a name read of a source), or inside the model (a call site's callee, known when
    it is called): either way at the cell's line."""
    assert site_error(cell).startswith(says)


def test_a_source_answers_hasattr_and_getattr_with_a_default():
    """An unknown name is also an AttributeError: whatever probes a source (a display, `hasattr`) gets its answer."""
    model, ids = fresh()
    namespace = {"model": model}
    nbgrad.trace(model, ids, "s = model.transformer.h[0].mlp.source\nx = s.self_c_fc_0.output.save()", namespace)
    source = namespace["s"]
    assert not hasattr(source, "shape") and getattr(source, "shape", "none") == "none"
    with pytest.raises(nbgrad.NbgradError, match="GPT2MLP.source has no site 'shape'"):
        source.shape


def test_an_unknown_inner_site_lists_the_callees_names():
    cell = "x = model.transformer.h[0].attn.source.attention_interface_1.source.nn_functional_softmx_0.output.save()"
    assert "has no site 'nn_functional_softmx_0'; nearest: nn_functional_softmax_0" in site_error(cell)


class Builtin(nn.Module):
    forward = torch.relu          # a C function: the module runs, but has no Python source


def generated_module():
    scope = {}
    exec("def forward(self, x):\n    return x * 2\n", scope)     # no file behind it: no source to read
    return type("Generated", (nn.Module,), {"forward": scope["forward"]})()


@pytest.mark.parametrize("make, says", [(Builtin, "has no Python source"),
                                        (generated_module, "its Python source cannot be read")])
def test_a_forward_without_python_source_says_so(make, says):
    model = make()
    forwards = class_forwards(model)
    with pytest.raises(nbgrad.NbgradError, match="line 1: .*" + says):
        nbgrad.trace(model, torch.ones(3), "y = model.source.x_0.output.save()", namespace={"model": model})
    with pytest.raises(nbgrad.NbgradError, match=says):
        nbgrad.source(model)
    assert_clean(model, forwards)
    assert torch.equal(model(torch.ones(3)), torch.ones(3) * (1 if make is Builtin else 2))


def test_an_error_inside_the_model_leaves_nothing():
    model, ids = fresh()
    forwards = class_forwards(model)
    with pytest.raises(nbgrad.NbgradError, match=r"line 1: .*self_c_attn_1.output is a tensor of shape \[1, 6, 96\], and "
                       r"line 1 put a tensor of shape \[5\] in its place; the model failed after that \(IndexError"):
        nbgrad.trace(model, ids, "model.transformer.h[0].attn.source.self_c_attn_1.output = torch.ones(5)\n",
                     namespace={"model": model, "torch": torch})
    assert_clean(model, forwards)
    namespace = {"model": model}
    nbgrad.trace(model, ids, "p = model.transformer.h[0].attn.source.self_c_attn_1.output.save()",
                 namespace=namespace)
    assert namespace["p"].shape == (1, 6, 96)
    assert_clean(model, forwards)


CELL = ("attn = model.transformer.h[0].attn.source.attention_interface_1\n"
        "pattern = attn.source.nn_functional_softmax_0.output\n"
        "model.transformer.h[0].attn.source.self_c_attn_1.output.mul_(2)\n"
        "with model.output.logits[0, -1].sum().backward():\n"
        "    grad = pattern.grad.save()\n")


def test_an_interrupt_at_any_line_leaves_nothing():
    model, ids = fresh()
    forwards = class_forwards(model)
    namespace = {"model": model}

    def cell():
        nbgrad.trace(model, ids, CELL, namespace=namespace)
    cell()
    with Injector(record=True) as counter:
        cell()
    interrupted = 0
    # every line that registers or removes a site's hook (where a lost handle leaves a forward behind), and a
    # sample of the rest
    for k in points(counter.lines, full=False, stride=max(1, counter.count // 150)):
        try:
            with Injector(k):
                cell()
        except KeyboardInterrupt:
            interrupted += 1
        finally:
            model.zero_grad(set_to_none=True)
        runtime._local.runtimes.clear()
        assert_clean(model, forwards)
    assert interrupted > 100
    cell()
    assert namespace["grad"].shape == (1, 4, 6, 6)


def test_a_module_defined_in_a_notebook_cell(shell):
    shell.run_cell("from torch import nn\n"
                   "class Scaled(nn.Module):\n"
                   "    def __init__(self):\n"
                   "        super().__init__()\n"
                   "        self.inner = nn.Linear(3, 3)\n"
                   "    def forward(self, x):\n"
                   "        y = self.inner(x)\n"
                   "        return y * 2\n"
                   "cellmodel = Scaled()\nxs = torch.randn(2, 3)", store_history=True)
    from IPython.utils.capture import capture_output
    with capture_output() as printed:
        assert shell.run_cell("%source cellmodel").success
    assert "Scaled.forward (sites: 2)" in printed.stdout
    assert any("self_inner_0, y_0" in line and "y = self.inner(x)" in line for line in printed.stdout.splitlines())
    result = shell.run_cell("%%trace cellmodel xs -q\n"
                            "y = cellmodel.source.self_inner_0.output.clone().save()\n"
                            "cellmodel.source.y_0.output[:] = 1\n"
                            "out = cellmodel.output.save()")
    assert result.success, result.error_in_exec
    ns = shell.user_ns
    assert torch.equal(ns["y"], ns["cellmodel"].inner(ns["xs"]))
    assert torch.equal(ns["out"], torch.full((2, 3), 2.0))
    assert "forward" not in vars(ns["cellmodel"]) and hook_count(ns["cellmodel"]) == 0
    assert "self_inner_0, y_0" in nbgrad.source(ns["cellmodel"])


def test_source_of_something_that_is_not_a_module_or_function_says_what_it_takes(shell):
    with pytest.raises(nbgrad.NbgradError, match="nbgrad.source takes a module or a Python function, not an int"):
        nbgrad.source(5)
    with pytest.raises(nbgrad.NbgradError, match="relu has no Python source"):
        nbgrad.source(torch.relu)
    result = shell.run_cell("%source")
    assert "%source MODULE: give a module" in str(result.error_in_exec or result.error_before_exec)


def test_source_of_a_site_path_or_an_unknown_name_says_what_to_give(shell):
    """Outside a %%trace cell a module has no `.source` (it is the cell's code, rewritten): `%source` of a site
    path says which listing to ask for instead of an AttributeError from torch; an unknown name is one line."""
    shell.run_cell("import nbgrad\nmodel = nbgrad.load_model()")
    site = shell.run_cell("%source model.transformer.h[0].attn.source.attention_interface_1")
    assert str(site.error_in_exec or site.error_before_exec) == (
        "`model.transformer.h[0].attn.source.attention_interface_1` is a site, and `.source` exists only inside a "
        "%%trace cell. `%source model.transformer.h[0].attn` lists the sites of its forward; the function a call "
        "site calls is known only while the model runs: give that function to %source")
    unknown = shell.run_cell("%source modle.transformer.h[0]")
    assert str(unknown.error_in_exec) == ("MODULE `modle.transformer.h[0]` could not be evaluated: NameError: name "
                                          "'modle' is not defined")
