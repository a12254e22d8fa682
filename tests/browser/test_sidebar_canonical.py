"""Canonical names and remote models in the sidebar. A GPT-2 model's modules show their canonical names beside their
own (`layers[3].attn` beside `attn` under `transformer.h.3`): a click on the name inserts the module's own path, on
its canonical name the canonical path, and a block's values (`resid_post`...) insert theirs; a model of no known family inserts its own paths.
A remote model is listed with its "remote" mark and where it lives, and after a cell ran on it its rows show that
run's shapes, as the local model's rows do after the same cell: the handle is nbgrad's own RemoteModel, its
actor a ModelHolder in the kernel's process (`ray.get` answers at once), as Ray would reach it on a cluster."""
from labtools import run_notebook, screenshot, show_sidebar

SETUP = ("%load_ext nbgrad\n"
         "import torch, nbgrad\n"
         "model = nbgrad.load_model()\n"
         "net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU())")
REMOTE = ("import ray\n"
          "from nbgrad.remote.actor import ModelHolder\n"
          "from nbgrad.remote.handle import RemoteModel\n"
          "class Call:\n"
          "    def __init__(self, function): self.remote = function\n"
          "class Here:\n"
          "    def __init__(self, holder): self.holder = holder\n"
          "    def __getattr__(self, name): return Call(getattr(self.holder, name))\n"
          "ray.get = lambda answer: answer\n"
          "big = RemoteModel(nbgrad.load_model, {'name': 'shared'}, actor=Here(ModelHolder(nbgrad.load_model)))")
# The same one-read cell on the remote model and on the local one: the sidebar shows the same shape on both rows
TRACED = ('%%trace big "The Eiffel Tower is in" -q\nh = big.transformer.h[1].output.save()',
          '%%trace model "The Eiffel Tower is in" -q\nh = model.transformer.h[1].output.save()')
SOURCE = "i => window.jupyterapp.shell.currentWidget.content.widgets[i].model.sharedModel.getSource()"
SIDEBAR = "#nbgrad-sidebar"


def _open_tree(page, selector):
    """Open every branch until `selector` is shown (the tree is built when the kernel's reply comes)."""
    page.wait_for_function(
        "s => { document.querySelectorAll('#nbgrad-sidebar details').forEach(d => d.open = true);"
        " const b = document.querySelector(s); return !!b && b.offsetParent !== null; }", arg=selector, timeout=60_000)


def _inserted(page, cell, click):
    """The text a click inserts into the (emptied) cell `cell`."""
    page.evaluate("i => { const nb = window.jupyterapp.shell.currentWidget.content; nb.activeCellIndex = i;"
                  " nb.mode = 'edit'; nb.widgets[i].model.sharedModel.setSource(''); }", cell)
    click()
    page.wait_for_function(f"i => ({SOURCE})(i).length > 0", arg=cell, timeout=10_000)
    return page.evaluate(SOURCE, cell)


def test_canonical_names_are_shown_and_a_click_inserts_the_canonical_path(lab, page):
    run_notebook(page, lab, "canonical.ipynb", [SETUP, REMOTE, *TRACED, ""])
    show_sidebar(page)
    row = f'{SIDEBAR} .nbgrad-node-row[data-path="model.transformer.h[3].attn"]'
    _open_tree(page, f"{row} .nbgrad-canonical")
    assert page.locator(f"{row} .nbgrad-canonical").inner_text() == "layers[3].attn"
    name = page.locator(f'{SIDEBAR} .nbgrad-node[data-path="model.transformer.h[3].attn"]')
    assert _inserted(page, 4, name.click) == "model.transformer.h[3].attn.output"     # its own path, as SPEC §7 says
    tag = page.locator(f"{row} .nbgrad-canonical")
    assert _inserted(page, 4, tag.click) == "model.layers[3].attn.output"
    chip = page.locator(f'{SIDEBAR} .nbgrad-canonical[data-canonical="model.layers[3]"]')
    assert _inserted(page, 4, chip.click) == "model.layers[3].output"
    values = page.locator(f'{SIDEBAR} .nbgrad-values[data-path="model.transformer.h[3]"] .nbgrad-value')
    assert values.all_inner_texts() == ["resid_pre", "resid_mid", "resid_post"]
    assert _inserted(page, 4, values.nth(2).click) == "model.layers[3].resid_post"
    assert page.locator(f'{SIDEBAR} .nbgrad-values[data-path="model"] .nbgrad-value').all_inner_texts() == ["logits"]
    # A model of no known family: its own paths, no canonical names.
    net = page.locator(f'{SIDEBAR} .nbgrad-node[data-path="net[0]"]')
    assert page.locator(f'{SIDEBAR} .nbgrad-node-row[data-path="net[0]"] .nbgrad-canonical').count() == 0
    assert _inserted(page, 4, net.click) == "net[0].output"
    _assert_on_one_line(page, row)
    page.locator(f'{SIDEBAR} .nbgrad-values[data-path="model.transformer.h[3]"]').scroll_into_view_if_needed()
    screenshot(page, "sidebar-canonical")
    _assert_remote(page)


def _assert_remote(page):
    row = f'{SIDEBAR} .nbgrad-tree > details > summary > .nbgrad-node-row[data-path="big"]'
    page.locator(row).scroll_into_view_if_needed()
    assert page.locator(f"{row} .nbgrad-remote").inner_text() == "remote"
    where = page.locator(f"{row} .nbgrad-where").inner_text()
    assert where.startswith("actor 'shared', pid ") and " on " in where, where
    assert page.locator(f"{row} .nbgrad-type").inner_text() == "GPT2LMHeadModel"
    cut = page.evaluate("r => { const edge = document.querySelector('#nbgrad-sidebar').getBoundingClientRect().right;"
                        " return [...document.querySelector(r).children].filter(c =>"
                        " c.getBoundingClientRect().right > edge + 0.5).map(c => c.textContent); }", row)
    assert cut == [], cut                    # the mark and where the model lives are shown whole
    assert page.locator(f'{SIDEBAR} .nbgrad-canonical[data-canonical="big.layers[0].mlp"]').count() == 1
    shape = f'{SIDEBAR} .nbgrad-node-row[data-path="big.transformer.h[1]"] .nbgrad-shape'
    _open_tree(page, shape)              # the remote cell's shapes: as the same cell's on the local model
    local = page.locator(f'{SIDEBAR} .nbgrad-node-row[data-path="model.transformer.h[1]"] .nbgrad-shape')
    assert page.locator(shape).inner_text() == local.inner_text()
    assert local.inner_text().startswith("out [1, ") and local.inner_text().endswith(", 128]")
    screenshot(page, "sidebar-remote")


def _assert_on_one_line(page, row):
    """The canonical name sits on the row's line, beside the module's name, and nothing in the row is cut."""
    boxes = page.evaluate("r => [...document.querySelector(r).children].map(c => { const b = c.getBoundingClientRect();"
                          " return [c.className, b.top, b.bottom, c.scrollWidth <= c.clientWidth + 1]; })", row)
    name, canonical = boxes[0], boxes[1]
    assert canonical[0] == "nbgrad-canonical" and abs(name[1] - canonical[1]) < 6, boxes
    assert all(fits for *_, fits in boxes), boxes
