"""`--over DATASET`: each example its own invoke in a padded batch; values and gradients equal running each
example alone with plain PyTorch hooks on the same weights. `--out DIR`: safetensors batches, resumed."""
import collections
import json
import re

import pytest
import torch
from safetensors import safe_open

import nbgrad
from helpers import assert_clean, model_state
from nbgrad.engine.results.cache import main_tensor

PROMPTS = ["The Eiffel Tower is in the city of", "Hi", "A much longer prompt that talks about many different "
           "things, one after the other", "Paris", "The capital of Italy is", "x y"]
BODY = """
last = model.transformer.h[1].output[:, -1].save()
first_block = model.transformer.h[0].output.save()
first_grad = model.transformer.h[0].output.grad.save()
model.lm_head.output[:, -1].max().backward()
"""


def plain_run(model, prompt):
    """The oracle: the example alone, hooks on the same weights, its own backward pass."""
    tokenizer = nbgrad.tokenizer_for(model)
    ids = torch.tensor([tokenizer(prompt)["input_ids"]])
    kept = {}

    def keep_first_block(module, args, output):
        output.retain_grad()
        kept["h0"] = output
    hooks = [model.transformer.h[1].register_forward_hook(lambda m, a, o: kept.__setitem__("last", o[:, -1])),
             model.transformer.h[0].register_forward_hook(keep_first_block)]
    try:
        logits = model(input_ids=ids).logits
        logits[:, -1].max().backward()
    finally:
        for hook in hooks:
            hook.remove()
    return kept["last"].detach(), kept["h0"].detach(), kept["h0"].grad


def check_against_plain_runs(model, saved, prompts):
    for index, prompt in enumerate(prompts):
        last, h0, h0_grad = plain_run(model, prompt)
        length = h0.shape[1]
        torch.testing.assert_close(saved["last"][index], last, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(saved["first_block"][index][:, -length:], h0, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(saved["first_grad"][index][:, -length:], h0_grad, atol=1e-5, rtol=1e-4)
        padding = saved["first_grad"][index][:, :-length]
        assert padding.numel() == 0 or padding.abs().max() == 0      # no gradient reaches the padding


def test_values_and_gradients_over_a_list_equal_each_example_run_alone(default_model):
    model = default_model
    model.zero_grad()
    namespace = {"model": model, "torch": torch}
    result = nbgrad.trace(model, None, BODY, namespace, over=PROMPTS, batch_size=4)
    assert [len(namespace[name]) for name in ("last", "first_block", "first_grad")] == [len(PROMPTS)] * 3
    assert result.saved["last"] is namespace["last"]
    grads_over = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    check_against_plain_runs(model, namespace, PROMPTS)
    # each example's backward accumulated into the parameters, as the plain loop's did
    for over, plain in zip(grads_over, (p.grad for p in model.parameters())):
        torch.testing.assert_close(over, plain, atol=1e-4, rtol=1e-3)
    model.zero_grad(set_to_none=True)
    assert not [name for name in namespace if name.startswith("_nbgrad") or name.startswith("__nbgrad")]


def test_a_backward_block_is_each_examples_own_pass(default_model):
    """A `with L.backward():` block runs one pass per example (the plain `L.backward()` of the test above
    runs one pass of the summed losses): both give each example its own gradient."""
    model = default_model
    body = ("top = model.lm_head.output[:, -1].max()\n"
            "with top.backward():\n"
            "    first_grad = model.transformer.h[0].output.grad.save()\n")
    namespace = {"model": model}
    nbgrad.trace(model, None, body, namespace, over=PROMPTS, batch_size=3)
    model.zero_grad(set_to_none=True)
    for index, prompt in enumerate(PROMPTS):
        h0_grad = plain_run(model, prompt)[2]
        torch.testing.assert_close(namespace["first_grad"][index][:, -h0_grad.shape[1]:], h0_grad, atol=1e-5, rtol=1e-4)
    model.zero_grad(set_to_none=True)


def test_token_ids_of_different_lengths_are_padded_as_text_is(default_model):
    tokenizer = nbgrad.tokenizer_for(default_model)
    ids = [tokenizer(prompt, return_tensors="pt")["input_ids"] for prompt in PROMPTS[:4]]
    namespace = {"model": default_model}
    nbgrad.trace(default_model, None, "last = model.transformer.h[1].output[:, -1].save()", namespace, over=ids,
                 batch_size=4)
    for index, prompt in enumerate(PROMPTS[:4]):
        torch.testing.assert_close(namespace["last"][index], plain_run(default_model, prompt)[0], atol=1e-5, rtol=1e-4)
    default_model.zero_grad(set_to_none=True)


def test_a_datasets_dataset_reads_its_text_column_or_the_one_named(default_model):
    datasets = pytest.importorskip("datasets")
    model = default_model
    table = datasets.Dataset.from_dict({"text": PROMPTS, "sentence": PROMPTS[::-1], "label": list(range(6))})
    namespace = {"model": model}
    nbgrad.trace(model, None, BODY, namespace, over=table, batch_size=3)
    model.zero_grad(set_to_none=True)
    check_against_plain_runs(model, namespace, PROMPTS)
    nbgrad.trace(model, None, "x = model.transformer.h[1].output[:, -1].save()", namespace,
                 over=table, column="sentence", batch_size=5)
    for index, prompt in enumerate(PROMPTS[::-1]):
        torch.testing.assert_close(namespace["x"][index], plain_run(model, prompt)[0], atol=1e-5, rtol=1e-4)
    streamed = {"model": model}           # an IterableDataset, read as it streams
    nbgrad.trace(model, None, "x = model.transformer.h[1].output[:, -1].save()", streamed,
                 over=table.to_iterable_dataset(), column="sentence", batch_size=4)
    assert len(streamed["x"]) == len(PROMPTS)
    for here, there in zip(namespace["x"], streamed["x"]):
        torch.testing.assert_close(there, here, atol=1e-5, rtol=1e-4)
    model.zero_grad(set_to_none=True)
    with pytest.raises(nbgrad.InputError, match="no column 'words'.*text, sentence, label"):
        nbgrad.trace(model, None, "x = model.transformer.h[1].output.save()", namespace, over=table, column="words")


def test_an_iterable_is_read_batch_by_batch(default_model):
    model = default_model
    calls, consumed_at_call = [], []
    handle = model.register_forward_hook(lambda *_: calls.append(1))

    def examples():
        for index, prompt in enumerate(PROMPTS * 2):
            consumed_at_call.append((index, len(calls)))
            yield prompt
    try:
        namespace = {"model": model}
        nbgrad.trace(model, None, "x = model.transformer.h[1].output[:, -1].save()", namespace,
                     over=examples(), batch_size=4)
    finally:
        handle.remove()
    assert len(calls) == 3 and len(namespace["x"]) == 12
    # example i was read after the model had run the batches before its own, not all up front
    assert all(calls_before == index // 4 for index, calls_before in consumed_at_call)


def test_a_bad_example_names_its_index_and_input_and_leaves_the_model_clean(default_model):
    model = default_model
    before = model_state(model)
    namespace = {"model": model}
    said = r"^example 4 \(INPUT ''\): the example has an empty prompt: it gives no tokens$"    # not the run's invoke
    with pytest.raises(nbgrad.NbgradError, match=said):
        nbgrad.trace(model, None, "x = model.transformer.h[1].output.save()", namespace,
                     over=["a b", "c", "d e f", "g", "", "h"], batch_size=3)
    assert_clean(model, before)
    assert "x" not in namespace and set(namespace) <= {"model", "__builtins__"}


@pytest.mark.parametrize("make, kind", [(list, "a list"), (lambda: (p for p in []), "a generator"),
                                         (lambda: __import__("datasets").Dataset.from_dict({"text": []}), "a Dataset")])
def test_a_dataset_with_no_examples_is_an_error_and_changes_no_name(default_model, tmp_path, make, kind):
    """Not a silent run of nothing that leaves the names of the last run in place (for --out as well)."""
    namespace = {"model": default_model, "last": "from before"}
    for out in (None, tmp_path / "acts"):
        with pytest.raises(nbgrad.InputError) as caught:
            nbgrad.trace(default_model, None, "last = model.transformer.h[1].output[:, -1].save()", namespace,
                         over=make(), out=out)
        assert str(caught.value) == (f"--over: the dataset ({kind}) has no examples, so the cell ran on none and no "
                                     f"name changed")
        assert namespace == {"model": default_model, "last": "from before"}


def test_an_error_in_the_body_names_the_example_and_the_cell_line(default_model):
    model = default_model
    before = model_state(model)
    body = "ok = model.transformer.h[0].output[:, -1].save()\nfifth = model.transformer.h[0].output[:, 4].save()\n"
    with pytest.raises(IndexError) as raised:
        nbgrad.trace(model, None, body, {"model": model}, over=["one two three four five six", "Hi"], batch_size=1)
    notes = " ".join(getattr(raised.value, "__notes__", []))
    assert "example 1 (INPUT 'Hi')" in notes and "line 2 of the cell" in notes
    assert_clean(model, before)
    # and the next run works
    namespace = {"model": model}
    nbgrad.trace(model, None, body, namespace, over=["one two three four five six"])
    assert len(namespace["fifth"]) == 1


def test_a_message_that_names_another_line_names_the_cells_line(default_model):
    """The batch's program repeats the cell once per example: a line a message mentions is mapped back, as the
    message's own line is."""
    with pytest.raises(nbgrad.GradError) as caught:        # one backward pass for the batch, on its last copy's line
        nbgrad.trace(default_model, None, "h = model.transformer.h[1].output[:, -1]\nx = h.grad.save()\n"
                     "model.lm_head.output[:, -1].max().backward()", {"model": default_model}, over=["a b", "c d", "e"],
                     batch_size=3)
    default_model.zero_grad(set_to_none=True)
    assert str(caught.value).startswith("line 2: h.grad was never computed by the backward pass of line 3 "
                                        "(model.lm_head.output[:, -1].max().backward())")


def test_an_interrupt_in_the_second_batch_leaves_model_and_namespace_clean(default_model, tmp_path):
    model = default_model
    before = model_state(model)
    calls = []

    def interrupt_second_call(*_):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
    handle = model.transformer.h[2].register_forward_hook(interrupt_second_call)
    namespace = {"model": model, "kept": "before"}
    try:
        with pytest.raises(KeyboardInterrupt) as raised:
            nbgrad.trace(model, None, "kept = model.transformer.h[1].output[:, -1].save()\n", namespace,
                         over=PROMPTS, batch_size=2)
    finally:
        handle.remove()
    assert raised.value.__notes__ == ["nbgrad: interrupted after 2 examples; no name was bound (with --out DIR, a "
                                      "run keeps every batch it finished)"]
    assert_clean(model, before)
    assert namespace == {"model": model, "kept": "before"}       # nothing of the run's, the old value kept
    nbgrad.trace(model, None, "kept = model.transformer.h[1].output[:, -1].save()\n", namespace, over=PROMPTS)
    assert len(namespace["kept"]) == len(PROMPTS)
    # with --out, the note says where the finished batch is
    calls.clear()
    handle = model.transformer.h[2].register_forward_hook(interrupt_second_call)
    try:
        with pytest.raises(KeyboardInterrupt) as raised:
            nbgrad.trace(model, None, "kept = model.transformer.h[1].output[:, -1].save()\n", namespace,
                         over=PROMPTS, batch_size=2, out=tmp_path)
    finally:
        handle.remove()
    assert raised.value.__notes__ == ["nbgrad: interrupted after 2 examples; every batch finished is in DIR: run "
                                      "the cell again to compute only the rest"]
    assert [p.name for p in tmp_path.glob("batch-*")] == ["batch-00000000.safetensors"]
    assert_clean(model, before)


def test_invoke_blocks_with_over_are_an_error_that_says_why(default_model):
    with pytest.raises(nbgrad.NbgradError, match="once per example.*without `with invoke"):
        nbgrad.trace(default_model, None, 'with invoke("a"):\n    x = model.transformer.h[0].output.save()\n',
                     {"model": default_model}, over=["a"])


def count_forward_calls(model):
    calls = []
    return calls, model.register_forward_hook(lambda *_: calls.append(1))


def test_out_writes_safetensors_and_a_second_run_computes_nothing(default_model, tmp_path):
    model = default_model
    body = "last = model.transformer.h[1].output[:, -1].save()\npair = [last, last * 2]\n"
    namespace = {"model": model}
    nbgrad.trace(model, None, body + "nbgrad.save(pair)\n", dict(namespace, nbgrad=nbgrad), over=PROMPTS,
                 batch_size=4, out=tmp_path / "acts")
    index = json.loads((tmp_path / "acts" / "index.json").read_text())
    assert index["batches"] == {"0": 4, "4": 2}
    for start in (0, 4):
        with safe_open(str(tmp_path / "acts" / f"batch-{start:08d}.safetensors"), framework="pt") as handle:
            assert "last/0" in handle.keys()
    calls, handle = count_forward_calls(model)
    try:
        again = {"model": model, "nbgrad": nbgrad}
        nbgrad.trace(model, None, body + "nbgrad.save(pair)\n", again, over=PROMPTS, batch_size=4,
                     out=tmp_path / "acts")
    finally:
        handle.remove()
    assert calls == []
    assert len(again["last"]) == len(PROMPTS) and not isinstance(again["last"], list)   # loads on access
    for index, prompt in enumerate(PROMPTS):
        torch.testing.assert_close(again["last"][index], plain_run(model, prompt)[0], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(again["pair"][index][1], again["last"][index] * 2)
    model.zero_grad(set_to_none=True)


def test_out_writes_a_cache_and_gives_back_caches_equal_to_a_run_in_memory(default_model, tmp_path):
    """`cache(...)` over a dataset, written to DIR: each example's Cache comes back (outputs, inputs and gradients,
    a module's output kept once though the next module's input is the same tensor); the model's own key-value
    cache object inside an output, which is no tensor, is left out."""
    model = default_model
    body = "c = cache(inputs=True, grads=True)\nmodel.lm_head.output[:, -1].max().backward()\n"
    kept, stored = {"model": model}, {"model": model}
    nbgrad.trace(model, None, body, kept, over=PROMPTS[:3], batch_size=2)
    nbgrad.trace(model, None, body, stored, over=PROMPTS[:3], batch_size=2, out=tmp_path / "acts")
    model.zero_grad(set_to_none=True)
    for memory, disk in zip(kept["c"], stored["c"]):
        assert isinstance(disk, nbgrad.Cache) and list(disk) == list(memory)
        for part in ("_outputs", "_inputs", "_grads"):
            want, got = getattr(memory, part), getattr(disk, part)
            assert list(got) == list(want)
            for path in want:
                same = main_tensor(got[path]), main_tensor(want[path])
                assert same[0] is None and same[1] is None or torch.equal(same[0], same[1].detach()), (part, path)
        assert type(disk["transformer"]) is type(memory["transformer"]) and disk["transformer"].cache is None
        assert torch.equal(disk.stack("transformer.h.?"), memory.stack("transformer.h.?").detach())
    calls, handle = count_forward_calls(model)
    try:
        again = {"model": model}
        nbgrad.trace(model, None, body, again, over=PROMPTS[:3], batch_size=2, out=tmp_path / "acts")
    finally:
        handle.remove()
        model.zero_grad(set_to_none=True)
    assert calls == [] and torch.equal(again["c"][2]["lm_head"], stored["c"][2]["lm_head"])


def test_a_saved_model_output_keeps_its_class_and_a_named_tuple_its_values(default_model, tmp_path):
    """`model.output.save()` per example is the model's output class, as alone (`o[k].logits`), read back from DIR
    too, where the key-value cache object it holds, which is no tensor, is left out."""
    model = default_model
    alone = {"model": model}
    nbgrad.trace(model, PROMPTS[1], "o = model.output.save()", alone)
    kept, stored = {"model": model}, {"model": model}
    nbgrad.trace(model, None, "o = model.output.save()", kept, over=PROMPTS[:3], batch_size=2)
    nbgrad.trace(model, None, "o = model.output.save()", stored, over=PROMPTS[:3], batch_size=2, out=tmp_path)
    length = alone["o"].logits.shape[1]
    for values in (kept["o"], stored["o"]):
        assert [type(value) for value in values] == [type(alone["o"])] * 3
        torch.testing.assert_close(values[1].logits[:, -length:], alone["o"].logits.detach(), atol=1e-5, rtol=1e-4)
    assert kept["o"][2].cache is not None and stored["o"][2].cache is None
    assert torch.equal(stored["o"][2].logits, kept["o"][2].logits)
    # a named tuple comes back from DIR a tuple of the same values (it came back as the file's own notes)
    pair = collections.namedtuple("Pair", "last n")
    body = "p = nbgrad.save(Pair(model.transformer.h[1].output[:, -1], 7))"
    namespace = {"model": model, "nbgrad": nbgrad, "Pair": pair}
    nbgrad.trace(model, None, body, namespace, over=PROMPTS[:2], batch_size=2, out=tmp_path / "pairs")
    assert type(namespace["p"][1]) is tuple and namespace["p"][1][1] == 7
    torch.testing.assert_close(namespace["p"][1][0], plain_run(model, PROMPTS[1])[0], atol=1e-5, rtol=1e-4)


def test_each_examples_cache_holds_copies_of_its_own_rows_without_the_batch_or_its_graph(default_model):
    """As every saved value of a dataset run: the batch's activations and autograd graph go with the batch. A tensor
    the cache holds twice (a block's output, the next block's input) stays one copy."""
    namespace = {"model": default_model}
    nbgrad.trace(default_model, None, "c = cache('transformer.h.*', inputs=True)", namespace, over=PROMPTS[:3],
                 batch_size=2)
    storages = set()
    for c in namespace["c"]:
        tensors = [main_tensor(v) for part in (c._outputs, c._inputs) for v in part.values()]
        assert all(t.grad_fn is None and not t.requires_grad and t._base is None for t in tensors)
        storages |= {t.untyped_storage().data_ptr() for t in tensors}
        assert c._inputs["transformer.h.1"] is main_tensor(c["transformer.h.0"])
    alone = {"model": default_model}
    nbgrad.trace(default_model, PROMPTS[1], "c = cache('transformer.h.*', inputs=True)", alone)
    assert len(storages) == sum(len({id(main_tensor(v)) for part in (c._outputs, c._inputs) for v in part.values()})
                                for c in namespace["c"])              # no example's tensor is another's
    real = alone["c"]["transformer.h.3"].shape[1]
    torch.testing.assert_close(namespace["c"][1]["transformer.h.3"][:, -real:], alone["c"]["transformer.h.3"].detach(),
                               atol=1e-5, rtol=1e-4)


def test_out_gives_back_each_call_of_a_module_called_twice(tmp_path):
    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(self.lin(x))
    torch.manual_seed(0)
    model, data = Twice(), [torch.randn(1, 4) for _ in range(3)]
    kept, stored = {"model": model}, {"model": model}
    nbgrad.trace(model, None, "c = cache('lin')", kept, over=data, batch_size=2)
    nbgrad.trace(model, None, "c = cache('lin')", stored, over=data, batch_size=2, out=tmp_path)
    for memory, disk in zip(kept["c"], stored["c"]):
        assert type(disk["lin"]) is type(memory["lin"]) and len(disk["lin"]) == 2
        assert all(torch.equal(a, b.detach()) for a, b in zip(disk["lin"], memory["lin"]))
    torch.testing.assert_close(stored["c"][1]["lin"][1], model.lin(model.lin(data[1])).detach())


def test_a_stopped_run_keeps_finished_batches_and_the_rerun_computes_only_the_rest(default_model, tmp_path):
    model = default_model
    body = "last = model.transformer.h[1].output[:, -1].save()\n"
    broken = ["a", "b", "c", "d", "e", "", "g", "h"]
    with pytest.raises(nbgrad.NbgradError, match=r"example 5 \(INPUT ''\)"):
        nbgrad.trace(model, None, body, {"model": model}, over=broken, batch_size=2, out=tmp_path)
    assert sorted(p.name for p in tmp_path.glob("batch-*")) == [f"batch-{s:08d}.safetensors" for s in (0, 2)]
    assert not list(tmp_path.glob(".*tmp"))
    calls, handle = count_forward_calls(model)
    try:
        namespace = {"model": model}
        fixed = broken[:5] + ["f"] + broken[6:]
        nbgrad.trace(model, None, body, namespace, over=fixed, batch_size=2, out=tmp_path)
    finally:
        handle.remove()
    assert len(calls) == 2          # batches 4-5 and 6-7 only
    for index, prompt in enumerate(fixed):
        torch.testing.assert_close(namespace["last"][index], plain_run(model, prompt)[0], atol=1e-5, rtol=1e-4)
    model.zero_grad(set_to_none=True)


def test_out_refuses_a_folder_of_another_cell(default_model, tmp_path):
    model = default_model
    nbgrad.trace(model, None, "a = model.transformer.h[0].output[:, -1].save()", {"model": model},
                 over=["x"], out=tmp_path)
    with pytest.raises(nbgrad.NbgradError, match="another cell"):
        nbgrad.trace(model, None, "b = model.transformer.h[1].output[:, -1].save()", {"model": model},
                     over=["x"], out=tmp_path)


def test_out_refuses_a_folder_of_other_examples_and_computes_a_longer_runs_new_batches(default_model, tmp_path):
    """The same cell over other INPUTs must not hand back the values DIR holds for the first ones; the same
    dataset grown longer reuses what matches and computes the rest (the old last batch was shorter)."""
    model = default_model
    body = "last = model.transformer.h[1].output[:, -1].save()\n"
    nbgrad.trace(model, None, body, {"model": model}, over=["a b", "c", "d e f"], batch_size=2, out=tmp_path)
    namespace = {"model": model}
    with pytest.raises(nbgrad.NbgradError) as caught:
        nbgrad.trace(model, None, body, namespace, over=["a b", "changed", "d e f"], batch_size=2, out=tmp_path)
    assert str(caught.value) == (
        f"--out {tmp_path} holds the values of other examples: the batch of examples 0-1 was computed from other "
        f"INPUTs than this run's (another dataset, or one that changed). Give a new DIR, or delete this one to "
        f"start again")
    assert "last" not in namespace
    longer = ["a b", "c", "d e f", "g", "h i"]
    calls, handle = count_forward_calls(model)
    try:
        nbgrad.trace(model, None, body, namespace, over=longer, batch_size=2, out=tmp_path)
    finally:
        handle.remove()
    assert len(calls) == 2          # examples 2-3 (DIR held example 2 alone) and 4; 0-1 read from DIR
    for index, prompt in enumerate(longer):
        torch.testing.assert_close(namespace["last"][index], plain_run(model, prompt)[0], atol=1e-5, rtol=1e-4)
    model.zero_grad(set_to_none=True)


def test_out_refuses_a_file(default_model, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(nbgrad.NbgradError, match=r"--out .*notes.txt is a file, not a folder: give a folder"):
        nbgrad.trace(default_model, None, "a = model.transformer.h[0].output[:, -1].save()", {"model": default_model},
                     over=["x"], out=tmp_path / "notes.txt")
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_the_magic_takes_a_folder_and_a_column(shell, tmp_path):
    datasets = pytest.importorskip("datasets")
    shell.run_cell("model = nbgrad.load_model()")
    shell.user_ns["table"] = datasets.Dataset.from_dict({"sentence": ["Hello there", "Hi", "Bye"]})
    result = shell.run_cell(f"%%trace model --over table --column sentence --batch-size 2 --out {tmp_path}/acts -q\n"
                            "h = model.transformer.h[0].output[:, -1].save()\n")
    result.raise_error()
    assert len(shell.user_ns["h"]) == 3 and (tmp_path / "acts" / "index.json").exists()


def test_the_magic_binds_lists_says_so_and_shows_them(shell, capsys):
    from IPython.utils.capture import capture_output
    shell.run_cell("model = nbgrad.load_model()\nprompts = ['Hello there', 'Hi']")
    with capture_output() as shown:
        result = shell.run_cell("%%trace model --over prompts --batch-size 1 --no-grad\n"
                                "h = model.transformer.h[0].output[:, -1].save()\n"
                                "full = model.transformer.h[0].output.save()\nc = cache('transformer.h.0')\n"
                                "o = model.output.save()\n")
    result.raise_error()
    assert len(shell.user_ns["h"]) == 2
    assert "h (2 values)" in shown.stdout
    # a panel: h's values stacked (one per example on axis 0); full's differ in length, so example 0; c's first cache
    panel, cache = (output.data for output in shown.outputs)
    items = panel["application/vnd.nbgrad.panel+json"]["items"]
    assert [item["name"] for item in items] == ["h", "full[0]", "o[0].logits"]
    assert items[0]["summary"]["shape"] == [2, 128] and "one per example on axis 0: 2 examples" in items[0]["note"]
    assert items[1]["summary"]["shape"] == list(shell.user_ns["full"][0].shape) and "example 0 of 2" in items[1]["note"]
    assert "transformer.h.0" in cache["text/plain"] and cache["text/plain"].startswith("c[0], the first example's")
    quiet = shell.run_cell("%%trace model --over prompts -q\nh = model.transformer.h[0].output[:, -1].save()\n")
    assert quiet.success and capsys.readouterr().out == ""
    failed = shell.run_cell("%%trace model 'Hi' --over prompts\nh = model.transformer.h[0].output.save()\n")
    assert "INPUT `'Hi'` and --over together" in str(failed.error_in_exec)


def test_sites_and_a_cache_in_the_body_are_each_examples_own(default_model):
    model = default_model
    before = model_state(model)
    namespace = {"model": model}
    prompts = ["The Eiffel Tower is in", "Hi", "x y z"]
    nbgrad.trace(model, None, 'c = cache("transformer.h.0.attn.c_attn")\n'
                 "site = model.transformer.h[0].attn.source.self_c_attn_1.output.save()\n",
                 namespace, over=prompts, batch_size=2)
    assert "forward" not in vars(model.transformer.h[0].attn)
    tokenizer = nbgrad.tokenizer_for(model)
    for index, prompt in enumerate(prompts):
        kept = {}
        handle = model.transformer.h[0].attn.c_attn.register_forward_hook(lambda m, a, o: kept.setdefault("o", o))
        try:
            model(input_ids=torch.tensor([tokenizer(prompt)["input_ids"]]))
        finally:
            handle.remove()
        length = kept["o"].shape[1]
        torch.testing.assert_close(namespace["site"][index][:, -length:], kept["o"], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(namespace["c"][index]["transformer.h.0.attn.c_attn"][:, -length:], kept["o"],
                                   atol=1e-5, rtol=1e-4)
    assert_clean(model, before)


@pytest.mark.parametrize("option, says", [({"workers": 2}, "--workers is for --engine ray"),
                                          ({"model_factory": lambda: None}, "--model-factory is for --engine ray"),
                                          ({"workers": 0, "engine": "ray"},
                                           "--workers must be a positive integer, not 0"),
                                          ({"workers": 1.5, "engine": "ray"},
                                           "--workers must be a positive integer, not 1.5")])
def test_ray_options_on_a_local_run_or_of_no_use_are_refused(default_model, option, says):
    before = model_state(default_model)
    with pytest.raises(nbgrad.NbgradError, match=says):
        nbgrad.trace(default_model, None, "h = model.transformer.h[0].output.save()", {"model": default_model},
                     over=["a", "b"], **option)
    assert_clean(default_model, before)


@pytest.mark.parametrize("option, says", [({"engine": "ray"}, "--engine (engine=) is for a run over a dataset"),
                                          ({"out": "acts"}, "--out (out=) is for a run over a dataset"),
                                          ({"batch_size": 2}, "--batch-size (batch_size=) is for a run over a"),
                                          ({"column": "text"}, "--column (column=) is for a run over a dataset"),
                                          ({"workers": 2}, "--workers (workers=) is for a run over a dataset")])
def test_dataset_options_without_a_dataset_are_refused(default_model, option, says):
    """An option of a run over a dataset on a cell that runs once would do nothing: it is refused, saying
    what it is for, before the model runs."""
    before = model_state(default_model)
    with pytest.raises(nbgrad.NbgradError, match=re.escape(says)) as caught:
        nbgrad.trace(default_model, "Hi", "h = model.transformer.h[0].output.save()", {"model": default_model},
                     **option)
    assert "This cell runs once (it has no --over): add --over DATASET (over=), or drop" in str(caught.value)
    assert_clean(default_model, before)


def test_the_magic_refuses_a_dataset_option_without_over(shell):
    shell.run_cell("model = nbgrad.load_model()\nran = []")
    failed = shell.run_cell("%%trace model 'Hi' --engine ray -q\nran.append(1)\n")
    assert "--engine (engine=) is for a run over a dataset: it sets where the batches run" in str(failed.error_in_exec)
    assert shell.user_ns["ran"] == []
    shell.run_cell("%%trace model 'Hi' --engine local -q\nh = model.transformer.h[0].output.save()\n").raise_error()
    assert shell.user_ns["h"].shape[0] == 1
