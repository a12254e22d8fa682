"""The statement kind "on-event function" (compile/hookloops.py, OnEvent; run/hookloops.py, start_one): a statement
whose one event is the output of a module at a static path is also compiled as a function of that value, and a fast
run calls it from the event instead of starting a generator, parking it and resuming it. It must give what the
general run gives (test_direct_run's comparison: values, names, timeline, errors, hooks), and what plain PyTorch hooks
give on the same weights."""
import pytest
import torch
from torch import nn

import nbgrad
from nbgrad.engine.compile.compiler import compile_cell
from nbgrad.engine.run import hookloops
from nbgrad.engine.run.rows import InvokeRows
from helpers import hook_count
from test_direct_run import MODEL, assert_same_both_ways

PATCH = """
with invoke(torch.tensor([[3, 17, 42, 5, 88, 9]])):
    clean = model.transformer.h[1].output[:, -1].save()
with invoke(torch.tensor([[3, 17, 42, 5, 88, 9]])):
    model.transformer.h[1].output[:, -1] = clean * 2
    patched = model.lm_head.output[:, -1].save()
"""

ON_EVENT_CELLS = {
    "a patch across invokes": PATCH,
    "an edit in place and a save": ("model.transformer.h[0].output[:, 1:] *= 0.5\n"
                                    "h = model.transformer.h[-1].output.save()\nlogits = model.output.logits.save()"),
    "a read kept for a gradient": ("h = model.transformer.h[1].output\nwith model.output.logits.sum().backward():\n"
                                   "    g = h.grad.save()"),
    "an edit after its event": ("late = model.transformer.h[2].output.save()\n"
                                "model.transformer.h[0].output[:] = late"),
    "an error inside the statement": "x = model.transformer.h[0].output[:, 99].save()",
    "an error inside an invoke": "with invoke(torch.tensor([[3, 17]])):\n    x = model.transformer.h[0].output[5].save()",
    "a module that never runs": "x = model.transformer.h[0].attn.attn_dropout.output[0].save()\n"
                                "y = model.transformer.h[1].output.save()",
    "invokes of two rows and of one": """
with invoke(torch.tensor([[3, 17, 42, 5], [8, 1, 2, 9]])):
    clean = model.transformer.h[1].output[:, -1].save()
with invoke(torch.tensor([[3, 17, 42, 5]])):
    model.transformer.h[1].output[:, -2:] += clean[:1]
    whole = model.transformer.h[1].output[:].save()
    patched = model.lm_head.output[:, -1].save()
""",
    "a tuple output in an invoke": """
with invoke(torch.tensor([[3, 17, 42]])):
    pair = model.transformer.h[0].attn.output[:]
    first = pair[0].save()
with invoke(torch.tensor([[5, 88, 9]])):
    x = model.transformer.h[0].attn.output[:]
""",
}


def test_which_statements_are_on_event_functions():
    kinds = [node.one is not None for node in compile_cell(PATCH).nodes]
    assert kinds == [True, True, True]
    one = compile_cell(PATCH).nodes[0].one
    assert (one.root, one.steps, one.use) == ("model", ("transformer", "h", 1), 0)
    assert compile_cell("x = model.transformer.h[-1].output.save()").nodes[0].one.steps == ("transformer", "h", -1)
    for source in ["x = torch.ones(1) + model.transformer.h[0].output",      # a call that would run before the event
                   "x = model.transformer.h[0].output if flag else 0",        # a branch that may pass the event by
                   "x = model.transformer.h[0].output + model.transformer.h[1].output",     # two events
                   "x = model.output.logits",                                 # the model itself: its call's return
                   "x = model.transformer.h[i].output",                       # an index known as it runs
                   "x = model.transformer.h[0].input",                        # an input event
                   "model.transformer.h[0].output = model.transformer.h[1].output",          # a whole replacement
                   "for i in range(2):\n    x = model.transformer.h[0].output"]:
        assert [node.one for node in compile_cell(source).nodes] == [None], source


@pytest.mark.parametrize("cell", sorted(ON_EVENT_CELLS))
def test_an_on_event_cell_gives_what_the_runtime_gives(cell, capfd, monkeypatch):
    taken = []
    original = hookloops.start_one
    monkeypatch.setattr("nbgrad.engine.run.runtime.Runtime._start_one",
                        lambda run, node, ahead=False: taken.append(original(run, node, ahead)) or taken[-1])
    ids = None if "invoke(" in ON_EVENT_CELLS[cell] else torch.tensor([[3, 17, 42, 5, 88, 9]])
    found = assert_same_both_ways(ON_EVENT_CELLS[cell], capfd, ids=ids)
    assert taken and taken[0], taken          # the fast run took the kind (a statement whose event has passed when
    #                                           it starts runs as written), and the general one did not ask
    assert found["saved"] or found["error"]
    if "error" in cell or "after its event" in cell or "never runs" in cell:
        assert found["error"] is not None


def test_an_invoke_statement_takes_its_rows_as_it_indexes(monkeypatch):
    """`output[:, -1]` in an invoke is `output[start:stop, -1]` of the batch's value (OnEvent.rows): one view, not the
    rows' view and then its index. A value that is no tensor of the batch's rows (a tuple) gets the rows' view."""
    assert [node.one.rows for node in compile_cell(PATCH).nodes] == [True, True, True]
    for source, rows in [("x = model.transformer.h[0].output[:]", True), ("model.h[0].output[:, 1:] *= 0.5", True),
                         ("x = model.transformer.h[0].output[0]", False), ("x = model.h[0].output[..., 0]", False),
                         ("x = model.transformer.h[0].output[1:]", False), ("x = model.h[0].output[::2]", False),
                         ("x = model.transformer.h[0].output.save()", False), ("x = model.h[0].output[0][:]", False)]:
        assert compile_cell(source).nodes[0].one.rows is rows, source
    views, original = [], InvokeRows.view
    monkeypatch.setattr(InvokeRows, "view", lambda rows, value, invoke: views.append(type(value)) or
                        original(rows, value, invoke))
    for cell in ("a patch across invokes", "invokes of two rows and of one", "a tuple output in an invoke"):
        views.clear()
        nbgrad.trace(MODEL, None, ON_EVENT_CELLS[cell], {"model": MODEL, "torch": torch})
        assert (views.count(tuple) == 2) if "tuple" in cell else views == [], (cell, views)    # (a tuple: by element)
    assert hook_count(MODEL) == 0


def test_the_patch_equals_plain_hooks_on_a_batch():
    ids = torch.tensor([[3, 17, 42, 5, 88, 9]])
    result = nbgrad.trace(MODEL, None, PATCH, {"model": MODEL, "torch": torch}, no_grad=True)
    kept = {}

    def patch(module, args, output):
        kept["clean"] = output[0, -1].clone()
        output[1, -1] = output[0, -1] * 2
    handles = [MODEL.transformer.h[1].register_forward_hook(patch),
               MODEL.lm_head.register_forward_hook(lambda m, a, out: kept.setdefault("patched", out[1:, -1]))]
    try:
        with torch.no_grad():
            MODEL(ids.repeat(2, 1))
    finally:
        for handle in handles:
            handle.remove()
    assert torch.equal(result.saved["clean"], kept["clean"][None])
    assert torch.equal(result.saved["patched"], kept["patched"])
    assert hook_count(MODEL) == 0


def _walks_in_forward(monkeypatch) -> tuple:
    """(whether each `walk` of an on-event statement's path came while the model ran, the hooks that tell it)."""
    walks, original, running = [], hookloops.walk, [False]
    monkeypatch.setattr(hookloops, "walk", lambda *args: walks.append(running[0]) or original(*args))
    handles = [MODEL.register_forward_pre_hook(lambda *_: running.__setitem__(0, True)),
               MODEL.register_forward_hook(lambda *_: running.__setitem__(0, False))]
    return walks, handles


def test_a_statement_that_waits_for_another_finds_its_module_before_the_model(monkeypatch):
    """The patch waits for `clean`, whose event is its own: it starts inside the forward, once `clean` has run. Its
    module is found, and its parts made, before the model runs, where the run's code is warm (start_one's `ahead`)."""
    walks, handles = _walks_in_forward(monkeypatch)
    try:
        result = nbgrad.trace(MODEL, None, PATCH, {"model": MODEL, "torch": torch}, no_grad=True)
    finally:
        for handle in handles:
            handle.remove()
    assert walks == [False, False, False]       # clean, patched, then the patch's ahead: none inside the forward
    general = nbgrad.trace(MODEL, None, PATCH, {"model": MODEL, "torch": torch}, no_grad=True, runner="general")
    assert torch.equal(result.saved["patched"], general.saved["patched"])
    assert [tuple(run) for run in result.graph.runs] == [tuple(run) for run in general.graph.runs]
    assert hook_count(MODEL) == 0


@pytest.mark.parametrize("change", ["a module registered", "the root rebound"])
def test_what_was_made_before_the_model_is_found_again_after_a_change(change, monkeypatch):
    """A module registered anywhere, or the path's root name bound to another object, between the run's start and the
    patch's: the patch finds its module again, as the general run evaluates its path then."""
    copy = type(MODEL)(MODEL.config).eval()

    def change_it(module, args, output):
        if change == "a module registered":
            nn.Module().add_module("spare", nn.Identity())
        else:
            namespace["model"] = copy
    outcomes, (walks, handles) = [], _walks_in_forward(monkeypatch)
    handles.append(MODEL.transformer.h[0].register_forward_hook(change_it))
    try:
        for runner in ("general", "fast"):
            namespace, walks[:] = {"model": MODEL, "torch": torch}, []
            try:
                result = nbgrad.trace(MODEL, None, PATCH, namespace, no_grad=True, runner=runner)
                outcomes.append(("saved", result.saved["patched"].tolist(), [tuple(run) for run in result.graph.runs]))
            except nbgrad.NbgradError as error:
                outcomes.append(("error", str(error)))
    finally:
        for handle in handles:
            handle.remove()
    assert walks == [False, False, False, True]     # the fast run's patch: found again, inside the forward
    assert outcomes[1] == outcomes[0]
    assert outcomes[0][0] == ("error" if change == "the root rebound" else "saved"), outcomes[0]
    assert hook_count(MODEL) == 0 and hook_count(copy) == 0


class Wrapped(nn.Module):
    """A model whose path to its blocks is a property: not `_modules` lookups, so the statement runs as written."""
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    @property
    def blocks(self):
        return self.inner.transformer.h

    def forward(self, ids):
        return self.inner(ids)


def test_a_path_not_found_in_modules_runs_as_a_generator(monkeypatch):
    taken = []
    original = hookloops.start_one
    monkeypatch.setattr("nbgrad.engine.run.runtime.Runtime._start_one",
                        lambda run, node, ahead=False: taken.append(original(run, node, ahead)) or taken[-1])
    wrapped, ids = Wrapped(MODEL), torch.tensor([[3, 17, 42]])
    source = "h = model.blocks[1].output[:, -1].save()"
    fast = nbgrad.trace(wrapped, ids, source, {"model": wrapped})
    general = nbgrad.trace(wrapped, ids, source, {"model": wrapped}, runner="general")
    assert taken == [False]
    assert torch.equal(fast.saved["h"], general.saved["h"])
    assert [tuple(run) for run in fast.graph.runs] == [tuple(run) for run in general.graph.runs]


@pytest.mark.parametrize("cell", ["an edit after its event", "an error inside the statement",
                                  "an error inside an invoke"])
def test_an_error_shows_the_same_cell_lines_both_ways(cell):
    """What a user reads of the traceback (errors.cell_traceback): the cell's frames at the same lines, whether the
    statement ran as a generator or as an on-event function (an error at its start: it runs as written)."""
    from nbgrad.errors import cell_traceback, is_cell_frame
    source, shown = ON_EVENT_CELLS[cell], []
    ids = None if "invoke(" in source else torch.tensor([[3, 17, 42, 5, 88, 9]])
    for runner in ("general", "fast"):
        with pytest.raises(Exception) as raised:
            nbgrad.trace(MODEL, ids, source, {"model": MODEL, "torch": torch}, runner=runner)
        tb, lines = cell_traceback(raised.value.__traceback__), []
        while tb is not None:
            lines.append(tb.tb_lineno if is_cell_frame(tb.tb_frame) else None)
            tb = tb.tb_next
        shown.append((type(raised.value).__name__, str(raised.value), lines))
    assert shown[0] == shown[1], shown
    assert any(shown[1][2]) or "too late" in shown[1][1]      # an error in the statement's code: at its line
