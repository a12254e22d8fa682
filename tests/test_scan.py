"""`nbgrad.scan`: the shapes and dtypes a cell saves, from fake tensors, equal a real run's, for every cell form of
the tutorials, on the embedded model and on a Llama-shaped model from a config; the model is not run and is left as
it was; an error is the real run's."""
import pytest
import torch

import nbgrad
from helpers import model_state, assert_clean
from nbgrad.remote.scan import Scan, TensorSpec, saved_specs, spec_of
from scan_cells import GENERATE_CELLS, TRACE_CELLS, build, for_model, namespace

FAMILIES = ["gpt2", "llama"]
STEPS = {"max_new_tokens": 3, "kwargs": {"min_new_tokens": 3}}     # every step, as a scan says


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    model = build(request.param)
    return request.param, model, namespace(model)


def run_both(model, names, input_name, source, options, generate=False):
    """(the real run's saved values as specs, the scan) of one cell, each on its own copy of the names."""
    options = dict(options)
    if "over" in options:
        options["over"] = names[options["over"]]
    input = names[input_name] if input_name else None
    run = nbgrad.generate if generate else nbgrad.trace
    real_names = dict(names)
    real = run(model, input, source, real_names, **options)
    scanned = nbgrad.scan(model, input, source, dict(names), generate=generate, **options)
    return Scan(saved_specs(real.saved, real_names)), scanned


@pytest.mark.parametrize("cell", TRACE_CELLS, ids=[cell[0] for cell in TRACE_CELLS])
def test_scan_equals_the_real_run(family, cell):
    name, model, names = family
    _, input_name, source, options = cell
    real, scanned = run_both(model, names, input_name, for_model(source, name), options)
    assert scanned and scanned == real, f"scan:\n{scanned}\nreal run:\n{real}"


@pytest.mark.parametrize("cell", GENERATE_CELLS, ids=[cell[0] for cell in GENERATE_CELLS])
def test_scan_of_generation_equals_the_real_run(family, cell):
    name, model, names = family
    _, input_name, source, options = cell
    real, scanned = run_both(model, names, input_name, for_model(source, name), {**options, **STEPS}, generate=True)
    assert scanned and scanned == real and all(len(steps) == 3 for steps in scanned.values())


def test_scan_equals_plain_hooks_and_runs_nothing(family):
    """Against the oracle: the shapes plain hooks see. The model is never called, and is left as it was."""
    name, model, names = family
    blocks = model.transformer.h if name == "gpt2" else model.model.layers
    ids = names["ids"]
    seen = {}
    handles = [blocks[1].register_forward_hook(lambda m, a, out: seen.update(out=out[0] if isinstance(out, tuple)
                                                                              else out))]
    with torch.no_grad():
        logits = model(ids).logits
    handles[0].remove()
    before, calls = model_state(model), []
    handles = [model.register_forward_pre_hook(lambda m, a: calls.append(1))]
    weights = [p.clone() for p in model.parameters()]
    source = for_model("h = BLOCKS[1].output.save()\n" + GRADIENT_OF_H, name)
    scanned = nbgrad.scan(model, ids, source, {"model": model})
    handles[0].remove()
    assert scanned["h"] == TensorSpec(seen["out"].shape, seen["out"].dtype) == scanned["g"]
    assert scanned["logits"] == TensorSpec(logits.shape, logits.dtype)
    assert calls == [] and all(torch.equal(p, w) for p, w in zip(model.parameters(), weights))
    assert_clean(model, before)


GRADIENT_OF_H = "logits = model.output.logits.save()\nwith logits[0, -1].max().backward():\n    g = h.grad.save()\n"


def test_a_scan_leaves_the_names_as_they_were():
    model = nbgrad.load_model()
    steer = torch.ones(128)
    names = {"model": model, "steer": steer, "kept": []}
    scanned = nbgrad.scan(model, "Hi", "steer.mul_(2)\nmodel.transformer.h[0].output[:] += steer\n"
                                       "kept.append(model.transformer.h[1].output.save())\nn = 3\n", names)
    assert list(scanned) == ["kept[0]"] and set(names) == {"model", "steer", "kept"}
    assert names["steer"] is steer and torch.equal(steer, torch.ones(128)) and names["kept"] == []


def test_the_table():
    model = nbgrad.load_model()
    scanned = nbgrad.scan(model, "Hi", "c = cache('transformer.h.0.mlp', grads=True)\n"
                                       "tops = [model.lm_head.output[0, -1].argmax().save()]\n"
                                       "model.output.logits[0, -1].max().backward()\n")
    width = len(nbgrad.tokenizer_for(model)("Hi").input_ids)
    assert repr(scanned) == (
        "name                            shape        dtype\n"
        f"c['transformer.h.0.mlp']        [1, {width}, 128]  float32\n"
        f"c.grads['transformer.h.0.mlp']  [1, {width}, 128]  float32\n"
        "tops[0]                         []           int64")
    assert scanned["tops[0]"] == TensorSpec(torch.Size([]), torch.int64)      # as Result.saved names it
    assert scanned["c"].grads["transformer.h.0.mlp"] == scanned["c"]["transformer.h.0.mlp"]



def test_a_canonical_cache_gives_its_gradients_shapes():
    """As the other cache forms do: `.grads` beside the values, each the shape of the gradient a plain hook sees."""
    model = nbgrad.load_model()
    ids = nbgrad.tokenizer_for(model)("Hi there", return_tensors="pt").input_ids
    grads, handles = {}, []

    def keep(module, args, output, index):
        output.register_hook(lambda grad: grads.__setitem__(index, grad))
    for index, block in enumerate(model.transformer.h[:2]):
        handles.append(block.register_forward_hook(lambda m, a, out, i=index: keep(m, a, out, i)))
    model(ids).logits[0, -1].max().backward()
    for handle in handles:
        handle.remove()
    model.zero_grad(set_to_none=True)
    scanned = nbgrad.scan(model, ids, "c = cache('layers.[01].resid_post', names='canonical', grads=True)\n"
                                      "model.logits[0, -1].max().backward()\n")
    assert list(scanned) == ["c"] and list(scanned["c"].grads) == ["layers.0.resid_post", "layers.1.resid_post"]
    for index in range(2):
        assert scanned["c"].grads[f"layers.{index}.resid_post"] == TensorSpec(grads[index].shape, grads[index].dtype)
    assert [row[0] for row in scanned.rows()] == ["c['layers.0.resid_post']", "c['layers.1.resid_post']",
                                                  "c.grads['layers.0.resid_post']", "c.grads['layers.1.resid_post']"]


ERRORS = {
    "a path not in the model": "h = model.transformer.hh[1].output.save()\n",
    "an index past the blocks": "h = model.transformer.h[4].output.save()\n",
    "a site not in the forward": "p = model.transformer.h[0].attn.source.attention_interface_9.output.save()\n",
    "a shape mismatch in the cell": "h = model.transformer.h[1].output\nh[:, :, :5] = torch.zeros(3)\n",
    "a gradient never computed": "x = 1\ng = model.transformer.h[1].output.grad.save()\n",
    "a write too late": "h = model.transformer.h[2].output\nmodel.transformer.h[0].output[:] = h\n",
    "a name not bound": "h = model.transformer.h[1].output * missing\n",
    "a loss that is not a scalar": "model.output.logits.backward()\n",
}


def raised(run):
    with pytest.raises(Exception) as error:
        run()
    value = error.value
    line = getattr(value, "line", None) or max((entry.lineno + 1 for entry in error.traceback
                                                 if str(entry.path).startswith("<nbgrad-cell")), default=None)
    return type(value), str(value), line


@pytest.mark.parametrize("source", list(ERRORS.values()), ids=list(ERRORS))
def test_an_error_is_the_real_runs(source):
    model = nbgrad.load_model(attn_implementation="eager")
    before = model_state(model)
    here = raised(lambda: nbgrad.trace(model, "Hi there", source, {"model": model, "torch": torch}))
    scanned = raised(lambda: nbgrad.scan(model, "Hi there", source, {"model": model, "torch": torch}))
    assert scanned == here
    assert_clean(model, before)


def test_an_error_inside_the_model_is_the_real_runs_in_torchs_shape_words():
    """Inside the model, torch's shape checks for fake tensors (its meta kernels) say what the real kernels say in
    words of their own: the same type, the same cell line, the same shapes."""
    model = nbgrad.load_model()
    source = "model.transformer.h[0].output = torch.zeros(1, 2, 7)\nh = model.transformer.h[1].output.save()\n"
    here = raised(lambda: nbgrad.trace(model, "Hi there", source, {"model": model, "torch": torch}))
    scanned = raised(lambda: nbgrad.scan(model, "Hi there", source, {"model": model, "torch": torch}))
    assert scanned[0] is here[0] is RuntimeError and scanned[2] == here[2]
    assert "normalized_shape=[128]" in scanned[1] and "[1, 2, 7]" in scanned[1]


def test_a_branch_on_values_is_said_with_its_line():
    model = nbgrad.load_model()
    source = "h = model.transformer.h[1].output\nsteps = h.norm().item()\nif h.norm() > 1:\n    x = h.save()\n"
    with pytest.raises(nbgrad.NbgradError, match=r"^line 3: nbgrad.scan cannot tell what this line does without the "
                                                 r"values: it decides on a number or a truth value that depends on a "
                                                 r"tensor's data \(an `if` on a tensor, say\), and a scan has shapes "
                                                 r"only. Run the cell$"):
        nbgrad.scan(model, "Hi", source)
    scanned = nbgrad.scan(model, "Hi", "h = model.transformer.h[1].output\npositive = h[h > 0].save()\n")
    assert str(scanned["positive"].shape[0]).startswith("u")      # a size the data decides: a symbol


def test_what_a_scan_does_not_take_is_said():
    model = nbgrad.load_model()
    for option in ({"out": "acts/"}, {"engine": "ray"}):
        with pytest.raises(nbgrad.NbgradError, match=f"nbgrad.scan runs the cell here, on fake tensors: "
                                                     f"`{next(iter(option))}` does not apply to it"):
            nbgrad.scan(model, None, "h = model.transformer.h[1].output.save()\n", over=["Hi"], **option)


def test_an_offloaded_model_is_scanned_without_its_placement(tmp_path):
    """Blocks on the disk and the CPU through accelerate: the twin lives on the CPU without accelerate's hooks
    (nor the offloaded weights they hold), and the model keeps its own."""
    from families import save_checkpoint
    from test_offload import CELL, EXPLICIT, _accelerate_hooks
    path = str(save_checkpoint("llama", tmp_path / "llama"))
    model = nbgrad.load_model(path, device_map=EXPLICIT, offload_folder=str(tmp_path / "offload"))
    ids = torch.tensor([[5, 17, 3, 99, 42, 7]])
    placed = _accelerate_hooks(model)
    scanned = nbgrad.scan(model, ids, CELL)
    real = nbgrad.trace(model, ids, CELL).saved
    assert scanned == {name: spec_of(value) for name, value in real.items()} and len(scanned) == 5
    assert _accelerate_hooks(model) == placed
