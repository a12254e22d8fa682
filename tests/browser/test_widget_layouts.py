"""A panel inside ipywidgets: placed in a layout (`VBox([slider, nbgrad.show(x)])`) it renders there as
its live widget, and an `interact` function that re-runs a trace shows the new panel each time."""
from labtools import run_notebook, screenshot

SETUP = "%load_ext nbgrad\nimport torch, nbgrad\nimport ipywidgets as widgets\nmodel = nbgrad.load_model()"
LAYOUT = ("x = torch.arange(24.0).reshape(4, 6)\n"
          "widgets.VBox([widgets.IntSlider(description='layer'), nbgrad.show(x, 'in_a_vbox')])")
INTERACT = ("def block(layer):\n"
            "    result = nbgrad.trace(model, 'The cat sat', f'h = model.transformer.h[{layer}].output.save()')\n"
            "    return nbgrad.show(result.saved['h'], f'block_{layer}')\n"
            "widgets.interact(block, layer=widgets.IntSlider(min=0, max=3, value=0))")


def test_a_panel_in_a_vbox_renders_there_as_its_widget(lab, page):
    run_notebook(page, lab, "layout.ipynb", [SETUP, LAYOUT])
    box = page.locator(".jp-OutputArea .widget-vbox").first
    box.locator(".nbgrad-panel").wait_for(timeout=120_000)
    assert box.locator(".widget-slider").count() == 1
    assert "in_a_vbox" in box.locator(".nbgrad-panel").first.inner_text()
    screenshot(page, "lab-panel-in-vbox")


def test_interact_shows_the_new_panel_each_time(lab, page):
    run_notebook(page, lab, "interact.ipynb", [SETUP, INTERACT])
    output = page.locator(".jp-OutputArea .widget-interact").first
    output.locator(".nbgrad-panel", has_text="block_0").wait_for(timeout=120_000)
    handle = output.locator(".widget-slider .noUi-handle").first     # the slider's knob, as a user moves it
    for layer in (1, 2, 3):
        handle.focus()
        page.keyboard.press("ArrowRight")
        output.locator(".nbgrad-panel", has_text=f"block_{layer}").wait_for(timeout=60_000)
        assert output.locator(".nbgrad-panel").count() == 1        # the new panel replaced the old one
    screenshot(page, "lab-panel-in-interact")
