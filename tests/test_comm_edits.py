"""The sidebar's comm on a model with edits: the model's entry lists each active edit, and each module an edit
skips (`M.skip(v)`) says which edits skip it; both go with `.remove()`."""
import nbgrad
from nbgrad.notebook import comm
from helpers import tiny_gpt2


def _module(tree: dict, path: str) -> dict:
    if tree["path"] == path:
        return tree
    found = [_module(child, path) for child in tree["children"] if path.startswith(child["path"])]
    return next(entry for entry in found if entry is not None) if found else None


def _entry(namespace: dict, path: str) -> dict:
    return _module(comm.answer({"request": "models"}, namespace)["models"][0], path)


def test_a_module_an_edit_skips_says_so_and_the_others_do_not():
    model = tiny_gpt2()
    namespace = {"model": model}
    skip = nbgrad.edit(model, "model.transformer.h[1].mlp.skip(model.transformer.h[1].ln_2.output)", namespace)
    steer = nbgrad.edit(model, "model.transformer.h[0].output[:] *= 2", namespace)
    assert _entry(namespace, "model.transformer.h[1].mlp")["skipped"] == ["nbgrad.edit(GPT2LMHeadModel)"]
    assert [edit["source"] for edit in _entry(namespace, "model")["edits"]] == [
        "model.transformer.h[1].mlp.skip(model.transformer.h[1].ln_2.output)", "model.transformer.h[0].output[:] *= 2"]
    marked = [path for path in ("model", "model.transformer.h[1]", "model.transformer.h[1].mlp.c_fc",
                                "model.transformer.h[0]", "model.transformer.h[1].ln_2")
              if "skipped" in _entry(namespace, path)]
    assert marked == []
    skip.remove()
    assert "skipped" not in _entry(namespace, "model.transformer.h[1].mlp")
    assert [edit["source"] for edit in _entry(namespace, "model")["edits"]] == ["model.transformer.h[0].output[:] *= 2"]
    steer.remove()
    assert _entry(namespace, "model")["edits"] == []


def test_two_edits_that_skip_one_module_are_both_named_and_the_tree_survives_a_call():
    model = tiny_gpt2()
    namespace = {"net": model}
    first = nbgrad.edit(model, "net.transformer.h[0].mlp.skip(net.transformer.h[0].ln_2.output)", namespace)
    second = nbgrad.edit(model, "net.transformer.h[0].mlp.skip(net.transformer.h[0].ln_2.output * 2)", namespace)
    first.label = "%%edit net --out first"
    model(model.dummy_inputs["input_ids"])          # a call arms each edit again: the mark stays
    assert _entry(namespace, "net.transformer.h[0].mlp")["skipped"] == [
        "%%edit net --out first", "nbgrad.edit(GPT2LMHeadModel)"]
    first.remove(), second.remove()
    assert "skipped" not in _entry(namespace, "net.transformer.h[0].mlp")


def test_a_skip_in_a_loop_is_marked_from_the_call_that_makes_it():
    """Its module is known only as the loop runs: the mark names the modules the latest call skipped."""
    model = tiny_gpt2()
    namespace = {"model": model, "chosen": [0, 2]}
    edit = nbgrad.edit(model, "for i in chosen:\n    model.transformer.h[i].skip(model.transformer.h[i].input)\n",
                       namespace)
    blocks = [f"model.transformer.h[{i}]" for i in range(4)]
    assert [path for path in blocks if "skipped" in _entry(namespace, path)] == []      # no call yet
    model(model.dummy_inputs["input_ids"])
    assert [path for path in blocks if "skipped" in _entry(namespace, path)] == [blocks[0], blocks[2]]
    assert _entry(namespace, blocks[0])["skipped"] == ["nbgrad.edit(GPT2LMHeadModel)"]
    namespace["chosen"][:] = [1]
    model(model.dummy_inputs["input_ids"])
    assert [path for path in blocks if "skipped" in _entry(namespace, path)] == [blocks[1]]
    edit.remove()
    assert [path for path in blocks if "skipped" in _entry(namespace, path)] == []
