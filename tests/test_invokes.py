"""`with invoke(INPUT):` blocks: one batch, each invoke's rows, checked against each INPUT run alone."""
import copy
import html
import weakref

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import nbgrad
from helpers import alone, assert_clean, model_state

EIFFEL = "The Eiffel Tower is in the city of"
COLOSSEUM = "The Colosseum is in"
SHORT = "Paris"


@pytest.fixture(scope="module")
def model():
    return nbgrad.load_model()


def test_clean_to_corrupt_patch_at_the_same_layer(model):
    before = model_state(model)
    result = nbgrad.trace(model, None, f"""
with invoke({EIFFEL!r}):
    clean = model.transformer.h[3].output[:, -1].save()
with invoke({COLOSSEUM!r}):
    model.transformer.h[3].output[:, -1] = clean
    patched = model.lm_head.output[:, -1].save()
""", no_grad=True)
    clean, _, _ = alone(model, EIFFEL, 3)

    def patch(output):
        output[:, -1] = clean[:, -1]
    _, patched, _ = alone(model, COLOSSEUM, 3, edit=patch)
    assert torch.allclose(result.saved["clean"], clean[:, -1], atol=1e-5)
    assert torch.allclose(result.saved["patched"], patched[:, -1], atol=1e-4)
    assert result.invokes == [EIFFEL, COLOSSEUM] and result.saved_invokes == {"clean": 0, "patched": 1}
    assert_clean(model, before)


def test_patch_across_layers_and_the_other_invoke_untouched(model):
    result = nbgrad.trace(model, None, f"""
with invoke({EIFFEL!r}):
    early = model.transformer.h[0].output[:, -1].save()
    own = model.lm_head.output[:, -1].save()
with invoke({COLOSSEUM!r}):
    model.transformer.h[2].output[:, -1] = early
    patched = model.lm_head.output[:, -1].save()
""", no_grad=True)
    early, eiffel_logits, _ = alone(model, EIFFEL, 0)

    def patch(output):
        output[:, -1] = early[:, -1]
    _, patched, _ = alone(model, COLOSSEUM, 2, edit=patch)
    assert torch.allclose(result.saved["patched"], patched[:, -1], atol=1e-4)
    assert torch.allclose(result.saved["own"], eiffel_logits[:, -1], atol=1e-4)     # the edit stayed in its rows


def test_three_invokes_of_different_lengths_equal_each_run_alone(model):
    result = nbgrad.trace(model, None, f"""
with invoke({EIFFEL!r}):
    a = model.lm_head.output.save()
with invoke({SHORT!r}):
    b = model.lm_head.output.save()
with invoke({COLOSSEUM!r}):
    c = model.lm_head.output.save()
everything = model.lm_head.output.save()
""", no_grad=True)
    for name, prompt in (("a", EIFFEL), ("b", SHORT), ("c", COLOSSEUM)):
        _, logits, _ = alone(model, prompt, 0)
        real = logits.shape[1]
        assert torch.allclose(result.saved[name][:, -real:], logits, atol=1e-5), name
    assert result.saved["everything"].shape[0] == 3       # a statement outside every invoke sees the batch


def test_token_ids_of_different_lengths_are_padded_as_text_is(model):
    """Tensors of ids, and dicts of `input_ids` and `attention_mask`, of different lengths: left-padded with the mask
    and position ids, so each invoke's values at its real tokens equal its ids run alone."""
    tokenizer = nbgrad.tokenizer_for(model)
    long, short = (tokenizer(prompt, return_tensors="pt") for prompt in (EIFFEL, SHORT))
    namespace = {"model": model, "long": long["input_ids"], "short": dict(short)}
    result = nbgrad.trace(model, None, """
with invoke(long):
    a = model.lm_head.output.save()
with invoke(short):
    b = model.lm_head.output.save()
""", namespace, no_grad=True)
    for name, prompt in (("a", EIFFEL), ("b", SHORT)):
        _, logits, _ = alone(model, prompt, 0)
        assert torch.allclose(result.saved[name][:, -logits.shape[1]:], logits, atol=1e-5), name


def test_tensors_of_different_shapes_for_a_model_without_a_mask_are_an_error_that_says_so():
    embed = torch.nn.Embedding(10, 4)
    with pytest.raises(nbgrad.InputError, match="line 3: the invokes' INPUTs cannot be put in one batch .*give "
                       "them one shape"):
        nbgrad.trace(embed, None, "with invoke(torch.tensor([[1, 2, 3]])):\n    a = embed.output.save()\n"
                     "with invoke(torch.tensor([[4, 5]])):\n    b = embed.output.save()", {"embed": embed, "torch": torch})


def test_per_invoke_gradients_equal_each_prompts_own_backward(model):
    before = model_state(model)
    result = nbgrad.trace(model, None, f"""
with invoke({EIFFEL!r}):
    ha = model.transformer.h[1].output
    la = model.lm_head.output[:, -1, 5].sum()
with invoke({COLOSSEUM!r}):
    hb = model.transformer.h[1].output
    lb = model.lm_head.output[:, -1, 7].sum()
with (la + lb).backward():
    gb = hb.grad.save()
    ga = ha.grad.save()
""")
    model.zero_grad(set_to_none=True)
    _, _, grad_a = alone(model, EIFFEL, 1, target=5)
    _, _, grad_b = alone(model, COLOSSEUM, 1, target=7)
    assert torch.allclose(result.saved["ga"], grad_a, atol=1e-6)
    real = grad_b.shape[1]
    assert torch.allclose(result.saved["gb"][:, -real:], grad_b, atol=1e-6)
    assert torch.count_nonzero(result.saved["gb"][:, :-real]) == 0
    assert result.grad_pairs == {"gb": "hb", "ga": "ha"}
    model.zero_grad(set_to_none=True)
    assert_clean(model, before)


def test_backward_inside_each_invoke_and_a_gradient_edit_in_one(model):
    result = nbgrad.trace(model, None, f"""
with invoke({EIFFEL!r}):
    ha = model.transformer.h[1].output
    la = model.lm_head.output[:, -1, 5].sum()
    with la.backward(retain_graph=True):
        ga = ha.grad.save()
with invoke({COLOSSEUM!r}):
    hb = model.transformer.h[1].output
    lb = model.lm_head.output[:, -1, 7].sum()
    with lb.backward():
        hb.grad[:] = 0
        early = model.transformer.h[0].output.grad.save()
""")
    model.zero_grad(set_to_none=True)
    _, _, grad_a = alone(model, EIFFEL, 1, target=5)
    model.zero_grad(set_to_none=True)
    assert torch.allclose(result.saved["ga"], grad_a, atol=1e-6)
    # block 0 feeds block 1 only through hb (the residual goes through block 1), so its gradient is zero
    assert torch.count_nonzero(result.saved["early"]) == 0


def test_invoke_with_a_list_is_several_rows(model):
    result = nbgrad.trace(model, None, f"""
with invoke([{EIFFEL!r}, {SHORT!r}]):
    both = model.lm_head.output[:, -1].save()
with invoke({COLOSSEUM!r}):
    last = model.lm_head.output[:, -1].save()
""", no_grad=True)
    assert result.saved["both"].shape[0] == 2 and result.saved["last"].shape[0] == 1
    _, short, _ = alone(model, SHORT, 0)
    assert torch.allclose(result.saved["both"][1], short[0, -1], atol=1e-5)


def test_a_tokenizer_that_gains_a_token_is_read_again(model):
    """Invokes keep the token ids of prompts they saw; a tokenizer whose vocabulary grew is asked again."""
    tokenizer = copy.deepcopy(nbgrad.tokenizer_for(model))
    source = "with invoke('hello zork'):\n    h = model.transformer.h[0].output.save()"
    first = nbgrad.trace(model, None, source, tokenizer=tokenizer, no_grad=True)
    assert first.input_ids[0].tolist() == tokenizer("hello zork")["input_ids"]
    tokenizer.add_tokens(["zork"])
    new_id = tokenizer.convert_tokens_to_ids("zork")
    with pytest.raises(nbgrad.InputError, match=f"token id {new_id}, outside the model's vocabulary"):
        nbgrad.trace(model, None, source, tokenizer=tokenizer, no_grad=True)


def test_a_cell_that_edits_its_input_ids_leaves_the_next_cell_its_own(model):
    """The padded batch is kept per set of prompts; each cell gets a copy, so an in-place edit of the ids
    in one cell is not seen by the next."""
    edit = f"with invoke({EIFFEL!r}):\n    model.transformer.wte.input[:] = 0\n" \
           f"with invoke({SHORT!r}):\n    h = model.transformer.h[0].output.save()"
    plain = edit.replace("    model.transformer.wte.input[:] = 0\n", "    pass\n")
    edited = nbgrad.trace(model, None, edit, no_grad=True)
    assert edited.input_ids[0].count_nonzero() == 0
    again = nbgrad.trace(model, None, plain, no_grad=True)
    tokenizer = nbgrad.tokenizer_for(model)
    assert again.input_ids[0].tolist() == tokenizer(EIFFEL)["input_ids"]
    short = tokenizer(SHORT)["input_ids"]
    assert again.input_ids[1, -len(short):].tolist() == short


def test_the_copy_of_the_inputs_is_lent_again_only_as_it_was_and_held_by_nothing(model):
    """A cell's inputs are a copy of the kept batch; the next cell with the same prompts gets the same copy again
    (Batch.call_kwargs) only when nothing holds it (a Result, a saved autograd graph, a view) and no edit changed it."""
    plain = f"with invoke({EIFFEL!r}):\n    pass\nwith invoke({SHORT!r}):\n    h = model.transformer.h[0].output.save()"
    edit = plain.replace("    pass\n", "    model.transformer.wte.input[:] = 0\n")
    expected = nbgrad.trace(model, None, plain, no_grad=True).input_ids.tolist()

    def lent(source=plain, no_grad=True):
        """(a weak reference to the cell's input ids, its Result's `h`); the Result let go."""
        result = nbgrad.trace(model, None, source, no_grad=no_grad)
        return weakref.ref(result.input_ids), result.saved["h"]
    first, _ = lent()
    second, _ = lent()          # (no strong reference to the first held meanwhile, an assert's included)
    assert first() is not None and second() is first()          # let go: lent again, as it was
    held = nbgrad.trace(model, None, plain, no_grad=True)
    another = nbgrad.trace(model, None, plain, no_grad=True)
    assert held.input_ids is first() and another.input_ids is not held.input_ids
    del held, another
    current, _ = lent()
    edited = nbgrad.trace(model, None, edit, no_grad=True)
    assert edited.input_ids is current() and edited.input_ids[0].count_nonzero() == 0
    del edited                      # edited in place, then let go: held by nothing, but not as it was lent
    after = nbgrad.trace(model, None, plain, no_grad=True)
    assert after.input_ids.tolist() == expected
    view = after.input_ids[:, 1:]          # a view outlives its Result: the copy is not lent again
    del after
    again = nbgrad.trace(model, None, plain, no_grad=True)
    assert again.input_ids.untyped_storage().data_ptr() != view.untyped_storage().data_ptr()
    del again, view
    _, h = lent(no_grad=False)       # `h`'s autograd graph holds the ids (the embedding's backward): a cell that
    #                                  edits its inputs in place gets its own, and `h`'s backward pass still runs
    edited = nbgrad.trace(model, None, edit, no_grad=True)
    assert edited.input_ids[0].count_nonzero() == 0 and h.grad_fn is not None
    h.sum().backward()
    model.zero_grad(set_to_none=True)


def test_an_invoke_input_given_by_name_is_what_the_name_holds(model):
    """INPUT written as a plain name is read from the namespace (Invoke.name), as evaluating it would: a name bound
    there, even one that shadows a builtin; one that is not, evaluated, with its error on the block's line."""
    cell = "with invoke(prompt):\n    a = model.lm_head.output[:, -1].save()\nwith invoke(str):\n    pass\n"
    result = nbgrad.trace(model, None, cell, {"model": model, "prompt": EIFFEL, "str": SHORT}, no_grad=True)
    assert result.invokes == [EIFFEL, SHORT]
    torch.testing.assert_close(result.saved["a"], alone(model, EIFFEL, 3)[1][:, -1], atol=1e-4, rtol=1e-4)
    with pytest.raises(nbgrad.NbgradError, match="^line 3: the invokes mix text and other INPUTs"):     # the builtin
        nbgrad.trace(model, None, cell, {"model": model, "prompt": EIFFEL}, no_grad=True)
    with pytest.raises(nbgrad.NbgradError, match="invoke INPUT `prompt` could not be evaluated: NameError: name "
                                                 "'prompt' is not defined"):
        nbgrad.trace(model, None, cell, {"model": model}, no_grad=True)


def test_a_new_pad_token_is_used_by_the_next_cell(model):
    tokenizer = copy.deepcopy(nbgrad.tokenizer_for(model))
    source = f"with invoke({EIFFEL!r}):\n    pass\nwith invoke({SHORT!r}):\n    h = model.transformer.h[0].output.save()"
    first = nbgrad.trace(model, None, source, tokenizer=tokenizer, no_grad=True)
    assert first.input_ids[1, 0] == (tokenizer.pad_token_id if tokenizer.pad_token_id is not None
                                     else tokenizer.eos_token_id)
    tokenizer.pad_token = tokenizer.convert_ids_to_tokens(7)
    second = nbgrad.trace(model, None, source, tokenizer=tokenizer, no_grad=True)
    assert second.input_ids[1, 0] == 7
    assert torch.equal(first.saved["h"][:, -1], second.saved["h"][:, -1])


def test_left_padding_with_a_llama_model(tmp_path):
    tokenizer = nbgrad.tokenizer_for(nbgrad.load_model())
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    llama = LlamaForCausalLM(config).eval()
    result = nbgrad.trace(llama, None, f"""
with invoke({EIFFEL!r}):
    a = model.output.logits.save()
with invoke({SHORT!r}):
    b = model.output.logits.save()
""", {"model": llama}, no_grad=True, tokenizer=tokenizer)
    for name, prompt in (("a", EIFFEL), ("b", SHORT)):
        logits = llama(tokenizer(prompt, return_tensors="pt")["input_ids"]).logits
        assert torch.allclose(result.saved[name][:, -logits.shape[1]:], logits, atol=1e-5), name


@pytest.mark.parametrize("source, kwargs, message", [
    (f"with invoke({SHORT!r}):\n    x = model.lm_head.output.save()", {"input": SHORT},
     "line 1: INPUT on the %%trace line and `with invoke(...)` blocks together"),
    (f"x = 1\nwhile x:\n    with invoke({SHORT!r}):\n        y = model.lm_head.output.save()", {},
     "line 3: `with invoke(...)` must stand at the top level of the cell, in a `for` loop or an `if` there"),
    (f"with invoke({SHORT!r}):\n    x = 1\nwith invoke([]):\n    y = model.lm_head.output.save()", {},
     "line 3: invoke([]) has no rows"),
    ("with invoke(''):\n    x = model.lm_head.output.save()", {}, "line 1: invoke('') has an empty prompt"),
])
def test_invoke_errors_name_the_line(model, source, kwargs, message):
    before = model_state(model)
    with pytest.raises(nbgrad.NbgradError) as caught:
        nbgrad.trace(model, kwargs.get("input"), source)
    assert message in str(caught.value)
    assert_clean(model, before)


def test_error_inside_an_invoke_leaves_the_model_clean(model):
    before = model_state(model)
    with pytest.raises(ZeroDivisionError):
        nbgrad.trace(model, None, f"with invoke({SHORT!r}):\n    x = model.transformer.h[0].output\n    y = 1 / 0")
    assert_clean(model, before)


def test_magic_with_invokes_and_its_panel_groups(shell, model):
    from nbgrad.views import panel_for_result
    shell.user_ns["model"] = model
    shell.run_cell(f"%%trace model -q\nwith invoke({EIFFEL!r}):\n    a = model.lm_head.output[:, -1].save()\n"
                   f"with invoke({SHORT!r}):\n    b = model.lm_head.output[:, -1].save()")
    assert torch.is_tensor(shell.user_ns["a"]) and shell.user_ns["b"].shape[0] == 1
    result = nbgrad.trace(model, None, f"with invoke({EIFFEL!r}):\n    a = model.lm_head.output[:, -1].save()\n"
                                       f"with invoke({SHORT!r}):\n    b = model.lm_head.output[:, -1].save()",
                          no_grad=True)
    panel = panel_for_result(result, nbgrad.tokenizer_for(model))
    assert [(item["name"], item["tab"]) for item in panel.items] == [("a", 0), ("b", 1)]
    titles = [tab["title"] for tab in panel.payload["tabs"]]
    assert titles == ['invoke 0: "The Eiffel Tower is …', 'invoke 1: "Paris"']     # the input, cut short
    assert EIFFEL in panel.payload["tabs"][0]["about"]
    assert repr(panel).splitlines()[0] == f"[{titles[0]}]" and repr(panel).splitlines()[2] == f"[{titles[1]}]"
    assert panel.static_html().index(html.escape(titles[1])) < panel.static_html().index("<b>b</b>") and "<b>a</b>" in panel.static_html()


def test_an_interrupt_at_any_line_of_an_invoke_cell_leaves_nothing():
    """Ctrl-C at a sample of lines (every set-up and clean-up line, a stride of the rest) of a two-invoke patch with
    a backward pass: no hook, flag, grad mode or runtime left, no name of ours, and the next run gives the same."""
    from interrupts import Injector, points
    from nbgrad.engine.run.runtime import active_runtime
    from helpers import tiny_gpt2
    model = tiny_gpt2(n_layer=2, seed=5)
    namespace = {"model": model, "a": torch.tensor([[5, 9, 2, 7]]), "b": torch.tensor([[3, 1, 4, 1]])}
    source = ("with invoke(a):\n    clean = model.transformer.h[0].output[:, -1].save()\n"
              "with invoke(b):\n    model.transformer.h[0].output[:, -1] = clean\n"
              "    logits = model.output.logits.save()\n"
              "    with logits[0, -1].max().backward():\n        g = model.transformer.h[1].output.grad.save()\n")
    nbgrad.trace(model, None, source, namespace)
    model.zero_grad(set_to_none=True)
    expected = {name: namespace[name] for name in ("clean", "logits", "g")}
    before = model_state(model)
    with Injector(record=True) as counter:
        nbgrad.trace(model, None, source, namespace)
    model.zero_grad(set_to_none=True)
    interrupted = 0
    for k in points(counter.lines, full=False, stride=max(1, counter.count // 150)):
        try:
            with Injector(k):
                nbgrad.trace(model, None, source, namespace)
        except KeyboardInterrupt:
            interrupted += 1
        model.zero_grad(set_to_none=True)
        assert_clean(model, before)
        assert active_runtime() is None and not [n for n in namespace if n.startswith("__nbgrad")], k
    assert interrupted > 100
    nbgrad.trace(model, None, source, namespace)
    assert all(torch.equal(namespace[name], value) for name, value in expected.items())
