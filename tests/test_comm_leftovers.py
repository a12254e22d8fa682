"""The sidebar lists models, not the names a loop or a cell left bound to a part of one."""
from torch import nn

from nbgrad.notebook.comm import models_in


def test_names_bound_to_a_submodule_of_a_listed_model_are_not_models(tiny):
    other = nn.Linear(2, 2)
    namespace = {"model": tiny, "module": tiny.transformer.h[1], "attn_module": tiny.transformer.h[0].attn,
                 "other": other, "layer": other}
    for module in tiny.modules():           # a loop over the model's modules leaves its last one bound
        pass
    namespace["last"] = module
    assert [tree["name"] for tree in models_in(namespace)] == ["model", "other", "layer"]


def test_a_module_listed_alone_keeps_its_tree(tiny):
    [tree] = models_in({"block": tiny.transformer.h[0]})
    assert tree["name"] == "block" and tree["children"]
