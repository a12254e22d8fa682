"""`%%edit MODEL` in IPython: it installs the body on the model for later cells, binds the Edit with --out,
and `%nbgrad` and the sidebar's comm list the edits that are on (their hooks apart from a cell's own)."""
import pytest
import torch

import nbgrad
from nbgrad.engine.edit.edits import active_edits
from nbgrad.notebook import comm
from helpers import hook_count, steered_logits, tiny_gpt2

BODY = "model.transformer.h[1].output[:, -1] += torch.arange(32.) / 8\n"


@pytest.fixture
def edited(shell):
    shell.user_ns.update(model=tiny_gpt2(), ids=torch.tensor([[3, 14, 15, 92, 65, 35]]))
    shell.user_ns["before"] = shell.user_ns["model"](shell.user_ns["ids"]).logits
    yield shell
    for edit in active_edits(shell.user_ns["model"]):
        edit.remove()
    for name in ("model", "ids", "before", "steer", "h", "after", "plain"):
        shell.user_ns.pop(name, None)


def _steered_block(model, ids):
    """Block 1's last position, steered by hand (read by a hook after the steering one)."""
    seen = []

    def steer(module, args, output):
        output[:, -1] += torch.arange(32.) / 8
    handles = [model.transformer.h[1].register_forward_hook(steer), model.transformer.h[1].register_forward_hook(
        lambda module, args, output: seen.append(output[:, -1].clone()))]
    model(ids)
    for handle in handles:
        handle.remove()
    return seen[0]


def test_the_cell_installs_the_edit_for_later_cells_until_it_is_removed(edited, capsys):
    shell = edited
    assert shell.run_cell(f"%%edit model --out steer\n{BODY}").success
    ns = shell.user_ns
    assert isinstance(ns["steer"], nbgrad.Edit) and active_edits(ns["model"]) == [ns["steer"]]
    assert shell.run_cell("%%trace model ids -q\nh = model.transformer.h[1].output[:, -1].save()\n"
                          "after = model.output.logits.save()").success
    assert shell.run_cell("plain = model(ids).logits").success
    assert shell.run_cell("steer.remove()").success
    expected = steered_logits(ns["model"], ns["ids"])
    assert torch.equal(ns["after"], expected) and torch.equal(ns["plain"], expected)
    assert torch.equal(ns["h"], _steered_block(ns["model"], ns["ids"]))
    assert torch.equal(ns["model"](ns["ids"]).logits, ns["before"]) and hook_count(ns["model"]) == 0


def test_nbgrad_lists_the_edits_and_counts_their_hooks_apart(edited, capsys):
    shell = edited
    shell.run_cell(f"%%edit model --out steer\n{BODY}")
    capsys.readouterr()
    shell.run_line_magic("nbgrad", "")
    out = capsys.readouterr().out
    assert "hooks live: 0 (beside the 3 hooks of the edits below)" in out
    assert ("edits active: 1 (each stays on its model until its .remove())\n"
            "  model: model.transformer.h[1].output[:, -1] += torch.arange(32.) / 8  [%%edit model --out steer]") in out
    shell.run_cell("steer.remove()")
    shell.run_line_magic("nbgrad", "")
    out = capsys.readouterr().out
    assert "hooks live: 0\n" in out and "edits active: none" in out


def test_the_sidebar_hears_of_each_models_edits(edited):
    shell = edited
    shell.run_cell(f"%%edit model --out steer\n{BODY}")
    trees = {tree["name"]: tree for tree in comm.answer({"request": "models"}, shell.user_ns)["models"]}
    assert trees["model"]["edits"] == [{"source": BODY.strip(), "label": "%%edit model --out steer"}]
    shell.run_cell("steer.remove()")
    trees = {tree["name"]: tree for tree in comm.answer({"request": "models"}, shell.user_ns)["models"]}
    assert trees["model"]["edits"] == []


@pytest.mark.parametrize("cell, said", [
    ("%%edit model\nx = model.transformer.h[0].output.save()\n", "line 1: `.save()` keeps a value after a cell"),
    ("%%edit nomodel\nmodel.transformer.h[0].output[:] = 0\n", "unknown model 'nomodel'"),
    ("%%edit ids\nmodel.transformer.h[0].output[:] = 0\n", "'ids' is a Tensor, not a torch.nn.Module"),
    ("%%edit model\n\n", "%%edit MODEL needs a body"),
    ("%%edit model --out 2x\nmodel.transformer.h[0].output[:] = 0\n", "--out takes a name"),
])
def test_a_refused_cell_says_why_and_installs_nothing(edited, capsys, cell, said):
    result = edited.run_cell(cell)
    assert not result.success and said in str(result.error_in_exec) + capsys.readouterr().err
    assert active_edits(edited.user_ns["model"]) == [] and hook_count(edited.user_ns["model"]) == 0


def test_a_helper_from_an_earlier_cell_edits_and_the_edit_keeps_only_the_names_it_reads(edited):
    shell = edited
    assert shell.run_cell("direction = torch.arange(32.) / 8\nunused = torch.zeros(1000)\n"
                          "def steer(i):\n    model.transformer.h[i].output[:, -1] += direction\n").success
    assert shell.run_cell("%%edit model --out e\nsteer(1)\n").success
    ns = shell.user_ns
    plain = ns["model"](ns["ids"]).logits
    kept = set(ns["e"].namespace) - {"__builtins__", "__nbgrad__"}
    ns["e"].remove()
    assert torch.equal(plain, steered_logits(ns["model"], ns["ids"])) and kept == {"steer", "model", "direction"}
    for name in ("direction", "unused", "steer", "e"):
        ns.pop(name)


def test_a_gradient_edit_cell_edits_the_backward_pass_of_a_later_cell(edited):
    shell = edited
    ns = shell.user_ns
    assert shell.run_cell("%%edit model --out steer\nmodel.transformer.h[1].output.grad[:, -1] = 0").success
    assert shell.run_cell("h = model.transformer.wte.weight\nmodel.zero_grad()\n"
                          "model(ids).logits[0, -1].max().backward()\nafter = h.grad.clone()").success
    assert shell.run_cell("steer.remove()").success

    def cut(grad):
        grad = grad.clone()
        grad[:, -1] = 0
        return grad
    model = ns["model"]
    handle = model.transformer.h[1].register_forward_hook(lambda m, a, out: (out.register_hook(cut), None)[1])
    model.zero_grad()
    model(ns["ids"]).logits[0, -1].max().backward()
    handle.remove()
    expected = model.transformer.wte.weight.grad.clone()
    model.zero_grad()
    model(ns["ids"]).logits[0, -1].max().backward()
    assert torch.equal(ns["after"], expected) and not torch.equal(expected, model.transformer.wte.weight.grad)
    assert hook_count(model) == 0


@pytest.mark.parametrize("body", [
    "model.transformer.h[0].mlp.skip(model.transformer.h[0].mlp.input)\n",            # a skip: its gate's hook
    "model.transformer.h[1].attn.source.attn_output_0.output[:, -1] = 0\n",           # a site: its call's hook
    "model.transformer.h[1].output.grad[:, -1] = 0\n",                                 # a gradient edit
], ids=["skip", "site", "gradient"])
def test_nbgrad_counts_no_hook_live_beside_a_skip_a_site_or_a_gradient_edit(edited, capsys, body):
    """The hooks of an edit's skip gate, site or tensor are not hooks on a module: `%nbgrad` counted them among the
    edit's and printed "hooks live: -1" between cells."""
    shell = edited
    shell.run_cell(f"%%edit model --out kept\n{body}")
    shell.run_cell("model(ids)")
    capsys.readouterr()
    shell.run_line_magic("nbgrad", "")
    out = capsys.readouterr().out
    assert "hooks live: 0 (beside the " in out, out
    shell.run_cell("kept.remove()")
    shell.run_line_magic("nbgrad", "")
    assert "hooks live: 0\n" in capsys.readouterr().out
