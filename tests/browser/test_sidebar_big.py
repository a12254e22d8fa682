"""The sidebar on a 32-block model: it opens with only the top of the tree built, builds a branch when
it is first opened, and keeps opened branches open when the tree is rebuilt after a cell that changed the model."""
from labtools import TOKEN, open_notebook, run_command, screenshot, wait_for_kernel_idle, write_notebook

SETUP = ("%load_ext nbgrad\n"
         "from transformers import LlamaConfig, LlamaForCausalLM\n"
         "model = LlamaForCausalLM(LlamaConfig(num_hidden_layers=32, hidden_size=16, intermediate_size=32,\n"
         "    num_attention_heads=2, num_key_value_heads=1, vocab_size=64, max_position_embeddings=32))")
NODES = "() => document.querySelectorAll('#nbgrad-sidebar .nbgrad-node').length"


def _open(page, path):
    page.evaluate("p => { document.querySelector(`#nbgrad-sidebar details[data-path=\"${p}\"]`).open = true; }", path)


def _attached(page, path, timeout=10_000):
    page.wait_for_selector(f'#nbgrad-sidebar .nbgrad-node[data-path="{path}"]', state="attached", timeout=timeout)


def test_a_32_block_model_opens_lazily_and_keeps_open_branches(lab, lab_root, page):
    write_notebook(lab_root / "big.ipynb", [SETUP, "import torch\nmodel.probe = torch.nn.Identity()", ""])
    open_notebook(page, lab, "big.ipynb")
    wait_for_kernel_idle(page)
    page.evaluate("() => window.jupyterapp.shell.activateById('nbgrad-sidebar')")
    run_command(page, "notebook:run-cell-and-select-next")
    page.wait_for_function("() => document.querySelector('#nbgrad-sidebar .nbgrad-status').textContent"
                           ".includes('1 model')", timeout=120_000)
    assert page.evaluate(NODES) == 3            # model, model.model, model.lm_head: nothing deeper yet
    _open(page, "model.model")
    _attached(page, "model.model.layers")
    _open(page, "model.model.layers")
    _attached(page, "model.model.layers[31]")
    blocks = page.evaluate("() => document.querySelectorAll("
                           "'#nbgrad-sidebar details[data-path=\"model.model.layers\"] > details').length")
    assert blocks == 32
    assert page.evaluate(NODES) == 3 + 4 + 32     # only the opened branches are built
    _open(page, "model.model.layers[31]")
    _attached(page, "model.model.layers[31].mlp")

    # After the next cell (it adds a module) the tree is rebuilt with the same branches open.
    page.evaluate("() => { document.querySelector('#nbgrad-sidebar .nbgrad-tree').firstChild.dataset.old = '1'; }")
    run_command(page, "notebook:run-cell-and-select-next")
    page.wait_for_function("() => { const t = document.querySelector('#nbgrad-sidebar .nbgrad-tree').firstChild;"
                           " return t && !t.dataset.old; }", timeout=60_000)
    _attached(page, "model.model.layers[31].mlp")
    assert page.evaluate("() => document.querySelector("
                         "'#nbgrad-sidebar details[data-path=\"model.model.layers[30]\"]').open") is False

    page.evaluate("() => { const nb = window.jupyterapp.shell.currentWidget.content;"
                  " nb.activeCellIndex = 2; nb.mode = 'edit'; }")
    page.locator('#nbgrad-sidebar .nbgrad-node[data-path="model.model.layers[31].mlp"]').click()
    page.wait_for_function("() => window.jupyterapp.shell.currentWidget.content.widgets[2].model.sharedModel"
                           ".getSource() === 'model.model.layers[31].mlp.output'", timeout=10_000)
    screenshot(page, "lab-sidebar-32-blocks")
    page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.shutdown()")


LEAF = {"params": 1, "total": 1, "output": None, "grad": None, "children": []}
TREE = {"models": [dict(LEAF, name="model", path="model", type="Net", total=3, children=[
    dict(LEAF, name="block", path="model.block", type="Block", total=2, children=[
        dict(LEAF, name="mlp", path="model.block.mlp", type="Linear")])])]}
# The sidebar widget's own reply handler, given two replies (the model changed between them): a branch opened between
# the two (its 'toggle' event not yet delivered, as when a reply from the kernel comes in the same turn).
REPLY_AFTER_OPENING = """tree => {
  const explorer = [...window.jupyterapp.shell.widgets('left')].find(w => w.id === 'nbgrad-sidebar');
  explorer.showModels(tree);
  const old = document.querySelector('#nbgrad-sidebar details[data-path="model.block"]');
  old.open = true;
  explorer.showModels({models: [{...tree.models[0], params: 2}]});
  if (old.isConnected) { return 'not rebuilt'; }
  return document.querySelector('#nbgrad-sidebar details[data-path="model.block"]').open;
}"""


def test_a_branch_opened_just_before_a_reply_stays_open(lab, page):
    page.goto(f"{lab.url}/lab?token={TOKEN}&reset")
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.widgets", timeout=120_000)
    page.wait_for_selector("#nbgrad-sidebar", state="attached", timeout=60_000)
    assert page.evaluate(REPLY_AFTER_OPENING, TREE) is True
