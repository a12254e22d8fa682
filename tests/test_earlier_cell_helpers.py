"""A function defined in an earlier notebook cell reads and edits events when a %%trace cell calls it
directly, like a function the cell defines; checked against plain forward hooks."""
import pytest
import torch

from helpers import assert_clean, model_state

IDS = torch.tensor([[5, 9, 2, 7, 11]])
HELPERS = """
def resid(i):
    return model.transformer.h[i].output

def silence(i, position=-1):
    model.transformer.h[i].output[:, position] = 0

def every_block():
    return [block.output for block in reversed(model.transformer.h)]
"""


@pytest.fixture
def notebook(shell, tiny):
    shell.user_ns.update(model=tiny, ids=IDS)
    assert shell.run_cell(HELPERS).success
    yield shell
    for name in ("resid", "silence", "every_block", "late", "early", "logits", "blocks", "x"):
        shell.user_ns.pop(name, None)


def plain_run(model, edit_block=None):
    """Block outputs and logits with plain forward hooks; `edit_block` zeroes that block's last position."""
    return plain_run_on(model, IDS, edit_block)


def plain_run_on(model, ids, edit_block=None):
    outputs, handles = {}, []
    for index, block in enumerate(model.transformer.h):
        def hook(mod, args, output, index=index):
            if index == edit_block:
                output = output.clone()
                output[:, -1] = 0
            outputs[index] = output
            return output
        handles.append(block.register_forward_hook(hook))
    try:
        logits = model(ids).logits
    finally:
        for handle in handles:
            handle.remove()
    return outputs, logits


def test_reads_in_any_order_and_edits(notebook, tiny):
    before = model_state(tiny)
    result = notebook.run_cell("%%trace model ids -q\nlate = resid(3).save()\nearly = resid(0).save()\n"
                               "silence(1)\nlogits = model.output.logits.save()")
    assert result.success, result.error_in_exec
    outputs, logits = plain_run(tiny, edit_block=1)
    ns = notebook.user_ns
    assert torch.equal(ns["late"], outputs[3]) and torch.equal(ns["early"], outputs[0])
    assert torch.allclose(ns["logits"], logits, atol=1e-6)
    assert callable(ns["resid"]) and ns["resid"].__name__ == "resid"     # the helper itself is unchanged
    assert_clean(tiny, before)


def test_a_helper_with_a_loop_inside(notebook, tiny):
    result = notebook.run_cell("%%trace model ids -q\nblocks = [b.save() for b in every_block()]")
    assert result.success, result.error_in_exec
    outputs, _ = plain_run(tiny)
    assert all(torch.equal(a, outputs[i]) for a, i in zip(notebook.user_ns["blocks"], [3, 2, 1, 0]))


def test_an_error_in_a_helper_points_at_the_calling_line_and_leaves_the_model_clean(notebook, tiny):
    before = model_state(tiny)
    result = notebook.run_cell("%%trace model ids -q\nx = model.lm_head.output.save()\nlate = resid(7).save()")
    assert not result.success
    assert "line 2" in str(result.error_in_exec) and "index 7 is out of range" in str(result.error_in_exec)
    assert_clean(tiny, before)
    assert notebook.run_cell("%%trace model ids -q\nearly = resid(0).save()").success


def test_a_helper_called_some_other_way_still_gets_the_hint(notebook, tiny):
    before = model_state(tiny)
    result = notebook.run_cell("%%trace model ids -q\nx = list(map(resid, [1]))")
    assert isinstance(result.error_in_exec, AttributeError)
    assert "called some other way" in "\n".join(getattr(result.error_in_exec, "__notes__", []))
    assert_clean(tiny, before)


def test_helpers_in_a_run_over_a_dataset(notebook, tiny):
    before = model_state(tiny)
    notebook.user_ns["rows"] = [IDS, IDS.flip(1), IDS + 1]      # one length: this model has no tokenizer to pad
    result = notebook.run_cell("%%trace model --over rows --batch-size 2 -q\nearly = resid(0).save()\n"
                               "silence(1)\nlogits = model.output.logits.save()")
    assert result.success, result.error_in_exec
    edited = [plain_run_on(tiny, ids, edit_block=1) for ids in notebook.user_ns["rows"]]
    for k, (outputs, logits) in enumerate(edited):
        length = logits.shape[1]
        assert torch.allclose(notebook.user_ns["early"][k][:, -length:], outputs[0], atol=1e-5)
        assert torch.allclose(notebook.user_ns["logits"][k][:, -length:], logits, atol=1e-5)
    assert_clean(tiny, before)
    notebook.user_ns.pop("rows")


def test_a_helper_called_in_a_reversed_loop_reads_in_any_order(notebook, tiny):
    """What a helper reads of its parameter, for what each call in the loop passes, is hooked before the run."""
    assert notebook.run_cell("def last_of(block):\n    return block.output[:, -1]").success
    try:
        result = notebook.run_cell("%%trace model ids -q\nx = [last_of(b).save() for b in reversed(model.transformer.h)]")
        assert result.success, result.error_in_exec
        outputs, _ = plain_run(tiny)
        assert [torch.equal(value, outputs[3 - k][:, -1]) for k, value in enumerate(notebook.user_ns["x"])] == [True] * 4
    finally:
        notebook.user_ns.pop("last_of", None)


def test_an_edit_in_a_helper_that_comes_too_late_is_an_error_not_lost(notebook, tiny):
    before = model_state(tiny)
    result = notebook.run_cell("%%trace model ids -q\nif model.transformer.h[2].output is not None:\n    silence(0)")
    assert not result.success
    assert str(result.error_in_exec).startswith("line 2: model.transformer.h[i].output is edited too late")
    assert_clean(tiny, before)
