"""The fast statement kinds (runner="fast", engine/run/runtime.py) against the general ones: the common cell, which
nbgrad runs directly, gives exactly what the runtime gives it, errors included. Each cell runs both ways on the same
weights and namespace; the saved values, the names left behind, the shapes for the sidebar, the steps of the
hook graph, what was printed and every error's type, message and notes must be the same. Which cells run
directly is checked too, so that a cell that needs the runtime's parts never runs without them."""
import contextlib
import io
import types
import weakref

import pytest
import torch
from hypothesis import given
from torch import nn

import nbgrad
from nbgrad.engine.compile.compiler import compile_cell
from nbgrad.engine.run.cellstate import _unsaved, unsaved_names
from nbgrad.engine.run.gradients import GradientEvents
from nbgrad.engine.run.runtime import Runtime
from helpers import hook_count, tiny_gpt2
from test_fuzz_cells import FUZZ, cells, source

IDS = torch.tensor([[3, 17, 42, 5, 88, 9]])
MODEL = tiny_gpt2(n_layer=3, seed=7)


class Holder:
    """Something that is not a module but has an `.output` (the cell reads it as a plain attribute)."""
    output = 5


DIRECT_CELLS = {
    "one read": "hs = model.transformer.h[-1].output.save()",
    "every block by index": ("outs = [model.transformer.h[i].output.save() "
                             "for i in range(len(model.transformer.h))]"),
    "every block, reversed": "outs = [b.output.save() for b in reversed(model.transformer.h)]",
    "named modules, parent first": ('d = {n: m.output.save() for n, m in model.named_modules() '
                                    'if n in ("transformer", "transformer.h.0")}'),
    "any order": "late = model.transformer.h[2].output.save()\nearly = model.transformer.h[0].output.save()",
    "scale in place": ("for i in range(len(model.transformer.h)):\n    model.transformer.h[i].output[:] *= 0.5\n"
                       "logits = model.output.logits.save()"),
    # loops that only edit each block's output run their body from the block's event (HookLoop)
    "an edit loop over the blocks": ("for b in model.transformer.h:\n    b.output[:, -1] += 1.5\n"
                                     "logits = model.output.logits.save()"),
    "an edit loop beside reads of its blocks": ("before = model.transformer.h[1].output.clone().save()\n"
                                                "for i in range(len(model.transformer.h)):\n"
                                                "    model.transformer.h[i].output[:, 0] = i\n"
                                                "    model.transformer.h[i].output[:, 1:] *= IDS[0, i] / 10\n"
                                                "model.transformer.h[1].output[:] += 1\n"
                                                "after = model.transformer.h[1].output.save()"),
    "an edit loop whose variable a later line reads": ("for i in range(len(model.transformer.h)):\n"
                                                       "    model.transformer.h[i].output[:] *= 0.5\n"
                                                       "last = model.transformer.h[i].output.save()"),
    "an edit loop over the cell's own range": ("range = lambda n: [2, 0]\nfor i in range(len(model.transformer.h)):\n"
                                               "    model.transformer.h[i].output[:] *= 0.5"),
    "an edit loop that fails at a block": ("for i in range(len(model.transformer.h)):\n"
                                           "    model.transformer.h[i].output[:, 0] = IDS[0, :1 + i // 2 * 5]\n"
                                           "logits = model.output.logits.save()"),
    "a list of saved last positions, by the block": ("outs = [b.output[:, -1].save() for b in model.transformer.h]\n"
                                                     "logits = model.output.logits.save()"),
    "a list of its blocks edited before and after": ("model.transformer.h[1].output[:] *= 2\n"
                                                     "outs = [b.output[0, 1:].save() for b in model.transformer.h]\n"
                                                     "model.transformer.h[2].output[:] += 1"),
    "a list over the cell's own len": ("len = lambda blocks: 2\n"
                                       "outs = [model.transformer.h[i].output.save() for i in range(len(IDS))]"),
    "replace twice": ("model.transformer.h[1].output = model.transformer.h[1].output + 1\n"
                      "model.transformer.h[1].output = model.transformer.h[1].output * 3\n"
                      "z = model.transformer.h[2].output.save()"),
    "edit then read the same event": ("model.transformer.h[1].output[:] *= 2\n"
                                      "b = model.transformer.h[1].output.clone().save()"),
    "patch later with an earlier value": ("h0 = model.transformer.h[0].output.clone()\n"
                                          "model.transformer.h[2].output[:] = h0\n"
                                          "logits = model.lm_head.output.save()"),
    "a name read after its event": ("h = model.transformer.h[2].output\n"
                                    "d = (h - model.transformer.h[0].output).save()"),
    "logit lens": ("h = model.transformer.h[1].output\n"
                   "lens = model.lm_head(model.transformer.ln_f(h)).save()\n"
                   "out = model.lm_head.output.save()"),
    "a function of the cell": ("def resid(i):\n    return model.transformer.h[i].output\n"
                               "r = resid(2).save()\ns = resid(0).save()"),
    "a branch on a value": ("if model.transformer.h[0].output.sum() > 0:\n"
                            "    a = model.transformer.h[1].output.save()\nelse:\n    a = None"),
    "a tuple output": "a = model.transformer.h[0].attn.output[0].save()",
    "row zero": "r = model.transformer.h[0].output[0].save()",
    "grad mode off by a statement": "torch.set_grad_enabled(False)\nh = model.transformer.h[1].output.save()",
    "grad mode off inside a loop": ("for i in range(3):\n    torch.set_grad_enabled(i != 1)\n"
                                    "    x = model.transformer.h[i].output.save()"),
    "nbgrad.save and an unsaved name": ("a = nbgrad.save(model.transformer.h[0].output)\n"
                                        "u = model.transformer.h[1].output"),
    "not a module": "x = holder.output",
    "no event at all": "x = 1\ny = x + 1",
    "a with block around no read": "with torch.no_grad():\n    x = torch.ones(2) * 2",
    "print": "print(tuple(model.transformer.h[0].output.shape))",
    "a path error caught by the cell": ("try:\n    x = model.transformer.h[9].output\nexcept Exception as error:\n"
                                        "    x = type(error).__name__\ny = model.transformer.h[0].output.save()"),
    # gradients (GradientEvents, with the direct run as its scheduler)
    "a gradient": ("h = model.transformer.h[0].output\nwith model.output.logits.sum().backward():\n"
                   "    g = h.grad.save()"),
    "gradients read in any order": ("a = model.transformer.h[0].output\nb = model.transformer.h[2].output\n"
                                    "with model.lm_head.output.sum().backward():\n    ga = a.grad.save()\n"
                                    "    gb = b.grad.save()\n    gb2 = model.transformer.h[2].output.grad.save()"),
    "a gradient edited": ("h = model.transformer.h[1].output\nx = model.transformer.h[0].output\n"
                          "with model.lm_head.output.sum().backward():\n    h.grad[:] *= 3\n    gx = x.grad.save()"),
    "a gradient replaced": ("h = model.transformer.h[1].output\nx = model.transformer.h[0].output\n"
                            "with model.lm_head.output.sum().backward():\n    h.grad = torch.zeros_like(h.grad)\n"
                            "    gx = x.grad.save()"),
    "a backward pass after the forward": ("h = model.transformer.h[1].output\nloss = model.output.logits[0, -1].max()\n"
                                          "loss.backward(retain_graph=True)\ng = h.grad.save()\n"
                                          "w = model.lm_head.weight.grad.clone().save()"),
    "two passes": ("h = model.transformer.h[1].output\nloss = model.output.logits.sum()\n"
                   "with loss.backward(retain_graph=True):\n    g1 = h.grad.save()\n"
                   "with (2 * loss).backward():\n    g2 = h.grad.save()"),
    "a gradient of the model's output, edited in place": ("model.transformer.h[1].output[:] *= 2\n"
                                                          "h = model.transformer.h[1].output\n"
                                                          "with model.output.logits.sum().backward():\n"
                                                          "    g = h.grad.save()"),
    # the pass runs inside the model's output hook: that event is still live when a gradient wakes a statement
    "the model's output edited from a gradient": ("h = model.transformer.h[1].output\n"
                                                  "with model.output.logits.sum().backward():\n"
                                                  "    model.output.logits[:] = h.grad.sum()\n"
                                                  "o = model.output.logits.save()"),
    "the model's output edited, then read": ("model.output.logits[:, 0] = 0\nx = model.output.logits.save()\n"
                                             "h = model.transformer.h[2].output.save()"),
    "a leaf's grad outside any pass": "x = model.transformer.wte.weight.grad",
    "a gradient edited by a line after the pass": ("h = model.transformer.h[1].output\n"
                                                   "loss = model.output.logits.sum()\n"
                                                   "loss.backward()\nh.grad[:] = 0\ng = h.grad.save()"),
    # errors
    "a gradient never computed": ("h = model.transformer.h[1].output.detach().requires_grad_()\n"
                                  "with model.output.logits.sum().backward():\n    g = h.grad.save()"),
    "a gradient read with no pass": "h = model.transformer.h[1].output\ng = h.grad.save()",
    "a loss that is not a scalar": "with model.output.logits.backward():\n    pass",
    "a second pass on a freed graph": ("loss = model.output.logits.sum()\nloss.backward()\nloss.backward()"),
    "edited too late": "model.transformer.h[0].output[:] = model.transformer.h[2].output",
    "replaced too late": "h = model.transformer.h[2].output\nmodel.transformer.h[0].output = h",
    "a path not in the model": "x = model.transformer.h[9].output",
    "a module that never runs": "x = model.transformer.h.output",
    "asked for too late to hook": 'x = [model.transformer.h[1].output, getattr(model.transformer, "h")[0].output]',
    "asked for after the forward": "h = model.output\nx = (h, getattr(model.transformer, 'h')[0].output)",
    "the cell raises": "h = model.transformer.h[1].output\nraise ValueError('raised by the cell')",
    "a tuple used as a tensor": "a = model.transformer.h[0].attn.output.sum()",
    "a wrong shape written": "model.transformer.h[0].output = torch.zeros(3)",
}

GENERAL_CELLS = {
    "an input": "x = model.transformer.h[0].input.save()",
    "a cache": "c = cache('transformer.h.*')",
    "stop": "h = model.transformer.h[0].output.save()\nstop()",
    "a site": "p = model.transformer.h[0].attn.source.attention_interface_0.output",
    "a skip": "model.transformer.h[0].mlp.skip(model.transformer.h[0].ln_2.output)",
    "a with block around a read": "with torch.no_grad():\n    h = model.transformer.h[0].output.clone()",
    "invokes": "with invoke(IDS):\n    h = model.transformer.h[0].output.save()",
}


@pytest.mark.parametrize("cell", sorted(DIRECT_CELLS))
def test_the_common_cells_run_directly(cell):
    assert compile_cell(DIRECT_CELLS[cell]).direct


@pytest.mark.parametrize("cell", sorted(GENERAL_CELLS))
def test_cells_that_need_the_runtimes_parts_do_not(cell):
    assert not compile_cell(GENERAL_CELLS[cell]).direct


UNKNOWN_RUNNER = r"runner='quick': a run's runner is \"fast\" \(the default: .*\) or \"general\""


@pytest.mark.parametrize("call", ["trace", "backward", "over"])
def test_a_runner_not_known_is_refused_and_so_is_one_for_a_dataset(call):
    namespace = {"model": MODEL}
    if call == "backward":
        with pytest.raises(nbgrad.NbgradError, match=UNKNOWN_RUNNER):
            nbgrad.backward(MODEL(IDS).logits.sum(), "", namespace, runner="quick")
    elif call == "trace":
        with pytest.raises(nbgrad.NbgradError, match=UNKNOWN_RUNNER):
            nbgrad.trace(MODEL, IDS, DIRECT_CELLS["one read"], namespace, runner="quick")
    else:
        with pytest.raises(nbgrad.NbgradError, match="runner='general' is for one run of a cell: a run over a data"):
            nbgrad.trace(MODEL, None, DIRECT_CELLS["one read"], namespace, runner="general", over=["Hello"])
    assert hook_count(MODEL) == 0 and set(namespace) == {"model"}


def test_a_direct_cell_runs_as_a_direct_run(monkeypatch):
    seen = []
    original = Runtime.run_trace
    monkeypatch.setattr(Runtime, "run_trace", lambda self, *a: seen.append(self.fast) or original(self, *a))
    nbgrad.trace(MODEL, IDS, DIRECT_CELLS["one read"], {"model": MODEL})
    nbgrad.trace(MODEL, IDS, GENERAL_CELLS["an input"], {"model": MODEL})
    assert seen == [True, False]


# --- one cell, both ways -------------------------------------------------------------------------------

def _same(one, other) -> bool:
    if isinstance(one, torch.Tensor) or isinstance(other, torch.Tensor):
        return (type(one) is type(other) and one.shape == other.shape and one.dtype == other.dtype
                and one.requires_grad == other.requires_grad and torch.equal(one, other))
    if isinstance(one, (list, tuple)) and type(one) is type(other):
        return len(one) == len(other) and all(map(_same, one, other))
    if isinstance(one, dict) and type(one) is type(other):
        return one.keys() == other.keys() and all(_same(one[k], other[k]) for k in one)
    return type(one) is type(other) and (one == other if isinstance(one, (int, float, str, type(None))) else True)


def outcome(text: str, direct: bool, capfd, model=MODEL, ids=IDS, **options) -> dict:
    """What one run of the cell leaves: the result or the error, the names, what was printed."""
    namespace = {"model": model, "torch": torch, "nbgrad": nbgrad, "holder": Holder(), "IDS": ids}
    grad_mode = torch.is_grad_enabled()
    model.zero_grad(set_to_none=True)     # each run's parameter gradients its own
    _unsaved.pop(id(namespace), None)     # names an earlier, freed namespace with the same id left there
    capfd.readouterr()
    try:
        runner = "fast" if direct else "general"
        result, error = nbgrad.trace(model, ids, text, namespace, runner=runner, **options), None
    except Exception as raised:
        result, error = None, raised
    printed = capfd.readouterr()
    graph = result.graph if result is not None else getattr(error, "nbgrad_graph", None)
    return {
        "error": error and (type(error).__name__, str(error), getattr(error, "__notes__", [])),
        "saved": result and result.saved, "shapes": result and result.shapes,
        "grad pairs": result and result.grad_pairs,
        "runs": graph and [tuple(run) for run in graph.runs], "failed": graph and graph.failed,
        "names": {name: value for name, value in namespace.items() if name != "__builtins__"},
        "unsaved": dict(unsaved_names(namespace)), "printed": (printed.out, printed.err),
        "hooks": hook_count(model), "grad mode": (grad_mode, torch.is_grad_enabled()),
        "parameter grads": {name: p.grad for name, p in model.named_parameters() if p.grad is not None},
    }


def assert_same_both_ways(text: str, capfd, **options) -> dict:
    general, direct = outcome(text, False, capfd, **options), outcome(text, True, capfd, **options)
    for part in general:
        assert _same(direct[part], general[part]), f"{part}:\n direct  {direct[part]}\n general {general[part]}"
    assert direct["hooks"] == 0 and direct["grad mode"][0] == direct["grad mode"][1]
    return direct


@pytest.mark.parametrize("cell", sorted(DIRECT_CELLS))
def test_a_direct_cell_gives_what_the_runtime_gives(cell, capfd):
    found = assert_same_both_ways(DIRECT_CELLS[cell], capfd)
    assert found["saved"] or found["error"] or cell in ("not a module", "no event at all", "print",
                                                        "a with block around no read", "a branch on a value",
                                                        "a leaf's grad outside any pass")


def test_under_no_grad_too(capfd):
    found = assert_same_both_ways(DIRECT_CELLS["scale in place"], capfd, no_grad=True)
    assert found["saved"]["logits"].grad_fn is None


@pytest.mark.parametrize("cell", ["a gradient", "a backward pass after the forward"])
def test_a_gradient_cell_under_no_grad_fails_the_same_way(cell, capfd):
    found = assert_same_both_ways(DIRECT_CELLS[cell], capfd, no_grad=True)
    assert found["error"][0] == "GradError" and "--no-grad" in found["error"][1]


def _same_both_ways_with_hooks_of_the_users(text: str, capfd, model, ids) -> dict:
    """`assert_same_both_ways` for a model that carries hooks of the user's: those stay, and nothing else."""
    users = hook_count(model)
    general = outcome(text, False, capfd, model=model, ids=ids)
    direct = outcome(text, True, capfd, model=model, ids=ids)
    for part in general:
        assert _same(direct[part], general[part]), f"{part}:\n direct  {direct[part]}\n general {general[part]}"
    assert direct["hooks"] == users and not direct["error"], direct["error"]
    return direct


def test_the_models_own_output_is_read_from_what_its_call_returns(capfd):
    """A direct run answers `model.output` from what the model's call returns, with no hook on the model (the hook,
    last of the model's, would see the same value): a hook of the user's on the model that replaces the output is
    seen by the cell, both ways, and the model carries no forward hook of nbgrad's while it runs."""
    model = tiny_gpt2(n_layer=2, seed=5)
    plain = model(IDS).logits
    during = []
    inside = model.transformer.h[0].register_forward_hook(lambda m, a, o: during.append(len(model._forward_hooks)))
    doubled = model.register_forward_hook(lambda m, a, o: type(o)(logits=o.logits * 2))
    try:
        found = _same_both_ways_with_hooks_of_the_users(
            "x = model.output.logits.save()\nwith model.output.logits.sum().backward():\n"
            "    g = model.transformer.h[1].output.grad.save()", capfd, model, IDS)
    finally:
        inside.remove()
        doubled.remove()
    assert torch.allclose(found["saved"]["x"], 2 * plain) and found["saved"]["g"] is not None
    assert during == [2, 1]           # the general runtime's hook on the model beside the user's, then the user's alone


def test_a_model_with_a_backward_hook_of_its_own_keeps_a_hook_on_its_output(capfd):
    """A full backward hook on the model wraps its output after the forward hooks, so what the call returns is not
    what a forward hook sees: the direct run then hooks the model's output as the runtime does."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))
    during = []
    inside = model[0].register_forward_hook(lambda m, a, o: during.append(len(model._forward_hooks)))
    backward = model.register_full_backward_hook(lambda m, grad_in, grad_out: None)
    try:
        found = _same_both_ways_with_hooks_of_the_users(
            "with (model.output ** 2).sum().backward():\n    g = model[0].output.grad.save()", capfd, model,
            torch.randn(3, 4))
    finally:
        inside.remove()
        backward.remove()
    assert found["saved"]["g"].shape == (3, 4) and during == [1, 1]


@pytest.mark.parametrize("runner", ["general", "fast"], ids=["general runtime", "direct run"])
def test_a_gradient_the_cell_took_the_place_of_lives_until_the_result_is_made(runner, monkeypatch):
    """Result.grad_pairs finds saved gradients by id. A gradient that an edit of the cell replaced with its copy must
    outlive the pairing, or a tensor made later (a saved copy of another gradient) may take its id and pass for it:
    a fuzzed cell once had a copy of one block's gradient paired with another block's output."""
    came, alive = [], []
    on_grad = GradientEvents._on_grad
    monkeypatch.setattr(GradientEvents, "_on_grad", lambda self, tensor_id, grad: (
        came.append(weakref.ref(grad)), on_grad(self, tensor_id, grad))[1])
    monkeypatch.setattr(Runtime, "_result", lambda self, result=Runtime._result: (
        alive.append([ref() is not None for ref in came]), result(self))[1])
    cell = ("a = model.transformer.h[2].output\nb = model.transformer.h[0].output\n"
            "with model.lm_head.output.sum().backward():\n    a.grad[:, 0] = 0\n    gb = b.grad.clone().save()")
    result = nbgrad.trace(MODEL, IDS, cell, {"model": MODEL}, runner=runner)
    MODEL.zero_grad(set_to_none=True)
    assert alive == [[True, True]] and result.grad_pairs == {}


def test_a_module_called_twice(capfd):
    shared = nn.Linear(4, 4)
    model = nn.Sequential(shared, nn.ReLU(), shared)
    found = assert_same_both_ways("first = model[0].output.save()\nmodel[2].output[:] = 0\nlast = model.output.save()",
                                  capfd, model=model, ids=torch.randn(2, 4))
    # `model[2]` is `model[0]`: the edit lands on that module's first call, whose zeros the second call maps to its bias
    assert torch.equal(found["saved"]["last"], shared.bias.expand(2, 4))


@FUZZ
@given(cells())
def test_fuzzed_forward_cells_give_what_the_runtime_gives(cell):
    """The fuzz test's cells (test_fuzz_cells.py) without a backward pass or an input read, both ways."""
    forward, _, no_grad = cell[:3]
    forward = [step for step in forward if step.kind != "input"]
    text = source(forward, [])
    assert compile_cell(text).direct, text
    with _Printed() as capfd:
        assert_same_both_ways(text, capfd, no_grad=no_grad)


@FUZZ
@given(cells().filter(lambda cell: cell[1]))
def test_fuzzed_gradient_cells_give_what_the_runtime_gives(cell):
    """The fuzz test's cells with a backward pass (reads and edits of gradients inside `with LOSS.backward():`),
    without an input read, both ways: the parameters' gradients must match too."""
    forward, backward, no_grad = cell[:3]
    forward = [step for step in forward if step.kind != "input"]
    text = source(forward, backward)
    assert compile_cell(text).direct, text
    with _Printed() as capfd:
        assert_same_both_ways(text, capfd, no_grad=no_grad)


class _Printed:
    """capfd's `readouterr` for a hypothesis test (a function-scoped fixture would be shared by its examples):
    what was printed to sys.stdout and sys.stderr since the last read."""

    def __enter__(self):
        self.out, self.err = io.StringIO(), io.StringIO()
        self.redirects = contextlib.ExitStack()
        self.redirects.enter_context(contextlib.redirect_stdout(self.out))
        self.redirects.enter_context(contextlib.redirect_stderr(self.err))
        return self

    def __exit__(self, *exc):
        return self.redirects.__exit__(*exc)

    def readouterr(self):
        printed = types.SimpleNamespace(out=self.out.getvalue(), err=self.err.getvalue())
        for stream in (self.out, self.err):
            stream.seek(0)
            stream.truncate()
        return printed


def test_saved_names_are_those_at_the_end_of_the_cell_when_read_later():
    """A direct run names its saved values when `Result.saved` is first read: the names are still those the cell
    left, whatever the namespace binds after it, and a list that held an unsaved value (unbound after the cell)
    names its saved elements, as the runtime's eager naming does."""
    cell = ("hs = model.transformer.h[0].output.save()\n"
            "outs = [b.output.save() for b in model.transformer.h]\n"
            "both = [model.transformer.h[1].output.clone().save(), model.transformer.h[1].output * 2]")
    general = nbgrad.trace(MODEL, IDS, cell, {"model": MODEL}, runner="general").saved
    namespace = {"model": MODEL}
    result = nbgrad.trace(MODEL, IDS, cell, namespace)
    kept = {"hs": namespace["hs"], "outs": list(namespace["outs"])}
    namespace["hs"], namespace["outs"] = "rebound", []
    saved = result.saved
    assert list(saved) == list(general) == ["hs", "outs[1]", "outs[2]", "both[0]"]
    assert saved["hs"] is kept["hs"] is kept["outs"][0] and saved["outs[2]"] is kept["outs"][2]
    assert "both" not in namespace and result.saved is saved
    later = nbgrad.trace(MODEL, IDS, "outs = [b.output.save() for b in model.transformer.h]", namespace)
    assert type(vars(later)["_saved"]) is not dict and list(later.saved) == ["outs[0]", "outs[1]", "outs[2]"]


def test_gradient_pairs_are_those_at_the_end_of_the_cell_when_read_later():
    """A direct run pairs saved gradients with their tensors when `Result.grad_pairs` is first read, from the names
    bound as the cell ended: the tensor's name is unbound by then (it was not saved), and a tensor bound to two names
    goes by the first in alphabetical order, as the runtime's eager pairing has it."""
    cell = ("zb = model.transformer.h[1].output\nab = zb\nsaved_out = model.transformer.h[0].output.save()\n"
            "with model.lm_head.output.sum().backward():\n    g = zb.grad.save()\n    g0 = saved_out.grad.save()")
    general = nbgrad.trace(MODEL, IDS, cell, {"model": MODEL}, runner="general").grad_pairs
    MODEL.zero_grad(set_to_none=True)
    namespace = {"model": MODEL}
    result = nbgrad.trace(MODEL, IDS, cell, namespace)
    MODEL.zero_grad(set_to_none=True)
    assert "zb" not in namespace and "ab" not in namespace
    namespace.update(zb=result.saved["g"], ab=torch.zeros(1), saved_out="rebound")
    assert type(vars(result)["_grad_pairs"]) is not dict
    assert result.grad_pairs == general == {"g": "ab", "g0": "saved_out"}
    assert result.grad_pairs is result.grad_pairs


def test_the_timeline_is_written_by_the_core_alone():
    """Every row is written by the core (scheduler.py): a statement's start in `start_ready`, every wake in `_advance`,
    and the rows of a cell of one-reads (onesave.py, which runs no statement through the core) by `one_read_rows`, from
    what that cell left, when the timeline is read; the differential tests above hold the rows of every kind equal to
    the general run's."""
    import pathlib
    package = pathlib.Path(nbgrad.__file__).parent
    writers = {path.relative_to(package).as_posix(): path.read_text().count("timeline.append")
               for path in package.rglob("*.py") if "timeline" in path.read_text()}
    assert {path for path, count in writers.items() if count} == {"engine/run/scheduler.py"}
