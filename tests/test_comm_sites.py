"""The sidebar's "sites" request: the sites of one module's forward, by its tree path, walked and never
evaluated; anything wrong is a reply that says so."""
from nbgrad.notebook import comm
from sitemodels import FAMILIES

import nbgrad


def test_the_sites_of_a_module_by_its_tree_path():
    model = FAMILIES["gpt2"][0]()
    reply = comm.answer({"request": "sites", "id": 4, "path": "model.transformer.h[0].attn"}, {"model": model})
    assert reply["reply"] == "sites" and reply["id"] == 4 and reply["path"] == "model.transformer.h[0].attn"
    assert reply["sites"] == list(nbgrad.source(model.transformer.h[0].attn).names)
    assert "self_c_attn_1" in reply["sites"] and not reply["truncated"]
    assert "forward" not in vars(model.transformer.h[0].attn)


def test_a_bad_path_or_no_source_is_a_reply_that_says_so():
    model = FAMILIES["gpt2"][0]()
    namespace = {"model": model, "x": 3}
    said = {
        "model.transformer.h[9]": "has no submodule '9'",
        "other.layer": "no model named 'other'",
        "x.y": "no model named 'x'",
        "model.transformer.h[0]; import os": "names and [indices] only",
        "model.__class__": "has no submodule '__class__'",
    }
    for path, message in said.items():
        reply = comm.answer({"request": "sites", "path": path}, namespace)
        assert reply["sites"] == [] and message in reply["error"], (path, reply)
    assert "module path" in comm.answer({"request": "sites", "path": 7}, namespace)["error"]
    assert "module path" in comm.answer({"request": "sites"}, namespace)["error"]
