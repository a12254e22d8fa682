"""Every view a magic shows carries a quiet footer with what produced it: the nbgrad, torch and transformers
versions, the model's name (or class) and the cell's magic line, in its static HTML (saved notebooks, exports)
and in the data of nbgrad's renderer (the live panel draws `footer`; tests/browser/test_panel_page.py)."""
import html
import re

import torch
import transformers
from IPython.utils.capture import capture_output

import nbgrad
from helpers import tiny_gpt2
from nbgrad.views.panel import MIME_TYPE

VERSIONS = f"nbgrad {nbgrad.__version__} · torch {torch.__version__} · transformers {transformers.__version__}"


def _shown(shell, line: str, cell: str = None) -> list:
    """The bundles a magic displayed."""
    with capture_output() as captured:
        result = shell.run_cell(f"%%{line}\n{cell}" if cell is not None else f"%{line}")
    result.raise_error()
    return [output.data for output in captured.outputs]


def _footer(page: str) -> str:
    found = re.findall(r'<div class="nbgrad-footer"[^>]*>([^<]*)</div>', page)
    assert len(found) == 1, page[-600:]
    return html.unescape(found[0])


def test_trace_panel_footer_names_versions_model_and_line(shell, default_model):
    shell.user_ns.update(fm=default_model)
    [bundle] = _shown(shell, 'trace fm "Hello World"', "h = fm.transformer.h[0].output.save()")
    expected = f"{VERSIONS} · nbgrad's embedded default (GPT2LMHeadModel) · %%trace fm \"Hello World\""
    assert _footer(bundle["text/html"]) == expected
    assert bundle[MIME_TYPE]["footer"] == expected
    assert bundle[MIME_TYPE]["provenance"] == {"nbgrad": nbgrad.__version__, "torch": torch.__version__,
                                               "transformers": transformers.__version__,
                                               "model": "nbgrad's embedded default (GPT2LMHeadModel)",
                                               "line": '%%trace fm "Hello World"'}
    # inside the panel's box, after its pictures
    assert bundle["text/html"].index("nbgrad-footer") > bundle["text/html"].rindex("<img")
    assert bundle["text/html"].endswith("</div></div>")


def test_a_hub_model_is_named_by_its_checkpoint_and_class(shell):
    model = tiny_gpt2()
    model.config.name_or_path = "openai-community/gpt2"
    shell.user_ns.update(hub=model, hub_ids=torch.tensor([[1, 2, 3]]))
    [bundle] = _shown(shell, "trace hub hub_ids", "o = hub.transformer.h[0].output.save()")
    assert _footer(bundle["text/html"]).endswith(" · openai-community/gpt2 (GPT2LMHeadModel) · %%trace hub hub_ids")


def test_backward_show_generate_and_cache_views_carry_it(shell, default_model):
    shell.user_ns.update(fm=default_model, fx=torch.tensor([1.0, 2.0], requires_grad=True))
    [backward] = _shown(shell, "backward (fx ** 2).sum()", "g = fx.grad.save()")
    assert _footer(backward["text/html"]) == f"{VERSIONS} · %%backward (fx ** 2).sum()"
    [shown] = _shown(shell, "show fx")
    assert _footer(shown["text/html"]) == f"{VERSIONS} · %show fx"
    [generated] = _shown(shell, 'generate fm "Hello" --max-new-tokens 2', "t = fm.lm_head.output.save()")
    assert _footer(generated["text/html"]).endswith(' · %%generate fm "Hello" --max-new-tokens 2')
    assert generated[MIME_TYPE]["footer"] == _footer(generated["text/html"])
    [cached] = _shown(shell, 'trace fm "Hello"', 'c = cache("transformer.h.0")')
    assert _footer(cached["text/html"]).endswith(' · %%trace fm "Hello"')


def test_the_footer_changes_neither_the_panel_nor_the_saved_values(shell, default_model):
    shell.user_ns.update(fm=default_model)
    [bundle] = _shown(shell, 'trace fm "Hello World"', "h = fm.transformer.h[0].output.save()")
    plain = nbgrad.show(shell.user_ns["h"], "h")._repr_mimebundle_()
    assert bundle[MIME_TYPE]["items"][0]["summary"] == plain[MIME_TYPE]["items"][0]["summary"]
    assert "provenance" not in plain[MIME_TYPE] and "nbgrad-footer" not in plain["text/html"]
