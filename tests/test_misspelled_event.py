"""A mistyped event name (`net[0].outptu`) says which event was meant, with the cell's line; the model is left
with no hooks and the next cell runs."""
import pytest
import torch
from torch import nn

import nbgrad


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))


def _hooks(model):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks) for m in model.modules())


@pytest.mark.parametrize("typo, meant, cell", [
    ("outptu", "output", "x = net[0].output.save()\ny = net[0].outptu.save()"),
    ("inptus", "inputs", "y = net[2].inptus.save()"),
    ("ouput", "output", "x = net[0].output.save()\nloss = net[2].output.sum()\nloss.backward()\ng = net[1].ouput.grad.save()"),
])
def test_a_mistyped_event_says_which_was_meant_with_its_line(typo, meant, cell):
    net = _net()
    with pytest.raises(AttributeError, match=f"no attribute '{typo}'") as caught:
        nbgrad.trace(net, torch.ones(1, 3), cell, {"net": net})
    line = next(k for k, text in enumerate(cell.splitlines(), start=1) if typo in text)
    kind = type(net[int(cell.split(f".{typo}")[0][-2])]).__name__
    [note] = caught.value.__notes__
    assert note == (f"nbgrad: line {line}: {kind} has no attribute `.{typo}`: did you mean `.{meant}`? "
                    f"(a module's events: .output, .input, .inputs)")
    assert _hooks(net) == 0
    assert torch.equal(nbgrad.trace(net, torch.ones(1, 3), "y = net[2].output.save()", {"net": net})["y"],
                       net(torch.ones(1, 3)))


def test_an_attribute_far_from_every_event_gets_no_such_note():
    net = _net()
    with pytest.raises(AttributeError, match="no attribute 'wieght'") as caught:
        nbgrad.trace(net, torch.ones(1, 3), "w = net[0].wieght.save()", {"net": net})
    assert not any("did you mean" in note for note in getattr(caught.value, "__notes__", []))


def test_the_magic_shows_the_note(shell, capsys):
    shell.user_ns.update(net=_net(), x=torch.ones(1, 3))
    shell.run_cell("%%trace net x\ny = net[0].outptu.save()")
    printed = capsys.readouterr()
    assert "did you mean `.output`?" in printed.out + printed.err
