"""Wrong input that used to reach Python or the model unexplained: an unknown keyword option of a public call, an
INPUT of a wrong kind that the model itself refuses, a misspelled canonical root name, an edit whose loop runs past
the last layer. Each is one error with its message; the model keeps no hook, the namespace gains no name, and the
next cell works."""
import pytest
import torch

import nbgrad
from nbgrad.errors import ArgumentError
from helpers import assert_clean, model_state, tiny_gpt2

IDS = torch.tensor([[1, 2, 3]])
SAVE = "h = model.transformer.h[0].output.save()"
EDIT = "model.transformer.h[0].output[:] *= 0.5"
NEXT = "kept = model.transformer.h[1].output.save()"


def refused_by_magic(shell, magic, line, body, error, match):
    """`%%magic line` over `body` in the notebook's shell raises `error` (matching `match`); the notebook gains no
    name, the model keeps nothing, and the next `%%trace` cell works."""
    model = tiny_gpt2(n_layer=2)
    shell.user_ns["model"] = model
    names, before = set(shell.user_ns), model_state(model)
    try:
        with pytest.raises(error, match=match) as caught:
            shell.run_cell_magic(magic, line, body)
        assert set(shell.user_ns) == names
        assert_clean(model, before)
        shell.run_cell_magic("trace", "model torch.tensor([[1, 2, 3]]) -q", NEXT)
        assert shell.user_ns.pop("kept").shape == (1, 3, 32)
    finally:
        shell.user_ns.pop("model")
    return caught.value


def next_cell_works(model, namespace):
    assert nbgrad.trace(model, IDS, NEXT, namespace).saved["kept"].shape == (1, 3, 32)
    namespace.pop("kept")


def refused(model, call, error, message=None):
    """`call(model, namespace)` raises `error` (whose text is `message`, when given); nothing is left behind."""
    namespace, before = {"model": model}, model_state(model)
    with pytest.raises(error) as caught:
        call(model, namespace)
    if message is not None:
        assert str(caught.value) == message
    assert set(namespace) - {"__builtins__"} == {"model"}     # exec puts Python's builtins in; nothing of ours
    assert_clean(model, before)
    next_cell_works(model, namespace)
    return caught.value


TRACE_OPTIONS = ("namespace, no_grad, tokenizer, graph, quiet, over, batch_size, out, engine, workers, column, "
                 "model_factory, progress, runner")
# (id, a call with a keyword the call does not take, the message)
KEYWORDS = [
    ("trace", lambda m, ns: nbgrad.trace(m, IDS, SAVE, ns, no_gard=True),
     f"nbgrad.trace: unknown option no_gard=; did you mean no_grad=? its options are {TRACE_OPTIONS}"),
    ("trace, nothing near", lambda m, ns: nbgrad.trace(m, IDS, SAVE, ns, zzz=1),
     f"nbgrad.trace: unknown option zzz=; its options are {TRACE_OPTIONS}"),
    ("backward", lambda m, ns: nbgrad.backward(m(IDS).logits.sum(), "", ns, retain_grahp=True),
     "nbgrad.backward: unknown option retain_grahp=; did you mean retain_graph=? its options are source, namespace, "
     "grad_output, retain_graph, create_graph, graph, quiet, runner"),
    ("generate", lambda m, ns: nbgrad.generate(m, IDS, SAVE, ns, max_new_token=2),
     "nbgrad.generate: unknown option max_new_token=; did you mean max_new_tokens=? its options are namespace, "
     "max_new_tokens, sample, out, kwargs, tokenizer, graph, quiet"),
    ("edit", lambda m, ns: nbgrad.edit(m, EDIT, ns, lable="halve"),
     "nbgrad.edit: unknown option lable=; did you mean label=? its options are namespace, label"),
    ("edit, a positional one misspelled", lambda m, ns: nbgrad.edit(m, EDIT, namspace=ns),
     "nbgrad.edit: unknown option namspace=; did you mean namespace=? its options are namespace, label"),
]


@pytest.mark.parametrize("call, message", [case[1:] for case in KEYWORDS], ids=[case[0] for case in KEYWORDS])
def test_an_unknown_keyword_names_the_nearest_option_and_all_of_them(call, message):
    error = refused(tiny_gpt2(n_layer=2), call, ArgumentError, message)
    assert isinstance(error, TypeError)          # where Python's own "unexpected keyword argument" was


HELP = ("INPUT may be a string or a list of strings (tokenized; a list is one padded batch), a PIL image or a list "
        "of them (through the model's image processor), a tensor (the first argument), a dict or BatchEncoding "
        "(keyword arguments) or a tuple (positional arguments)")
# (INPUT, how it went to the model, as the note says it)
PLAIN_INPUTS = [((1,), "positional arguments, as given: argument 0 is an int `1`"),
                ({"input_ids": 5}, "keyword arguments, as given: input_ids= is an int `5`"),
                (([1, 2, 3],), "positional arguments, as given: argument 0 is a list `[1, 2, 3]`"),
                ({"input_ids": [1, 2, 3]}, "keyword arguments, as given: input_ids= is a list `[1, 2, 3]`")]


def model_error(call, input):
    """What the model itself raises on `input` as nbgrad passes it (a tuple positional, a dict keyword), unhooked."""
    try:
        call(*input) if isinstance(input, tuple) else call(**input)
    except (AttributeError, TypeError) as error:
        return type(error), str(error)
    raise AssertionError("the model took it")


@pytest.mark.parametrize("run", ["trace", "generate"])
@pytest.mark.parametrize("input, passed", PLAIN_INPUTS, ids=[repr(case[0]) for case in PLAIN_INPUTS])
def test_an_input_the_model_refuses_keeps_its_error_with_a_note_of_how_it_was_passed(run, input, passed):
    model = tiny_gpt2(n_layer=2)
    kind, message = model_error(model if run == "trace" else model.generate, input)
    call = getattr(nbgrad, run)
    error = refused(model, lambda m, ns: call(m, input, SAVE, ns), kind)
    assert str(error) == message
    assert error.__notes__ == [f"nbgrad: INPUT {input!r} went to the model as its {passed}, where the model takes a "
                               f"tensor. {HELP}"]


def test_the_magic_gives_the_same_note(shell):
    error = refused_by_magic(shell, "trace", "model {'input_ids': 5}", SAVE, AttributeError,
                             "'int' object has no attribute")
    assert error.__notes__[0].startswith("nbgrad: INPUT {'input_ids': 5} went to the model as its keyword arguments, "
                                         "as given: input_ids= is an int `5`")


def test_an_error_of_the_cells_own_line_gets_no_input_note():
    """A plain value among the model's keywords (logits_to_keep=1) and a TypeError over an int raised by the cell
    itself: the cell's error, as Python made it."""
    model = tiny_gpt2(n_layer=2)
    cell = "x = model.transformer.h[0].output\ny = len(1)"
    error = refused(model, lambda m, ns: nbgrad.trace(m, {"input_ids": IDS, "logits_to_keep": 1}, cell, ns), TypeError,
                    "object of type 'int' has no len()")
    assert not any("went to the model" in note for note in getattr(error, "__notes__", []))


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
    return LlamaForCausalLM(config).eval()


def llama_next_cell_works(model, namespace):
    saved = nbgrad.trace(model, IDS, "kept = model.model.layers[1].output.save()", namespace).saved["kept"]
    assert saved.shape == (1, 3, 32)
    namespace.pop("kept")


# (id, a call naming a misspelled canonical root, the error, its message or the note it gets)
ROOTS = [
    ("trace, a submodule", lambda m, ns: nbgrad.trace(m, IDS, "x = model.embedd.output.save()", ns),
     nbgrad.ModulePathError, "line 1: model.embedd is not in the model: model (GPT2LMHeadModel) has no submodule "
     "'embedd'; its submodules: transformer, lm_head. model.embedd is not a canonical name of the gpt2 family "
     "either; did you mean model.embed?"),
    ("trace, an indexed name", lambda m, ns: nbgrad.trace(m, IDS, "x = model.layer[0].resid_post.save()", ns),
     AttributeError, "nbgrad: line 1: model.layer is not a canonical name of the gpt2 family either; did you mean "
                     "model.layers?"),
    ("edit", lambda m, ns: nbgrad.edit(m, "model.layer[0].output[:] *= 2", ns), nbgrad.ModulePathError,
     "line 1: model.layer is not in the model: model (GPT2LMHeadModel) has no submodule 'layer'; its submodules: "
     "transformer, lm_head. model.layer is not a canonical name of the gpt2 family either; did you mean "
     "model.layers?"),
    ("generate", lambda m, ns: nbgrad.generate(m, IDS, "x = model.ln_finl.output.save()", ns, max_new_tokens=2),
     nbgrad.ModulePathError, "did you mean model.ln_final?"),
]


@pytest.mark.parametrize("call, error, says", [case[1:] for case in ROOTS], ids=[case[0] for case in ROOTS])
def test_a_misspelled_canonical_root_says_what_was_meant(call, error, says):
    caught = refused(tiny_gpt2(n_layer=2), call, error)
    if isinstance(caught, nbgrad.NbgradError):
        assert str(caught) == says if says.startswith("line") else says in str(caught)
    else:
        assert caught.__notes__ == [says]


def test_a_misspelled_root_of_a_llama_names_the_canonical_one():
    model = tiny_llama()
    namespace, before = {"model": model}, model_state(model)
    with pytest.raises(AttributeError) as caught:
        nbgrad.trace(model, IDS, "\nx = model.layer[1].resid_post.save()", namespace)
    assert caught.value.__notes__ == ["nbgrad: line 2: model.layer is not a canonical name of the llama family "
                                      "either; did you mean model.layers?"]
    assert_clean(model, before)
    llama_next_cell_works(model, namespace)


def test_a_root_far_from_every_canonical_name_or_a_model_of_no_known_family_gets_no_hint():
    model = tiny_gpt2(n_layer=2)
    error = refused(model, lambda m, ns: nbgrad.trace(m, IDS, "x = model.foo.output.save()", ns),
                    nbgrad.ModulePathError)
    assert str(error).endswith("its submodules: transformer, lm_head")
    plain = torch.nn.Sequential(torch.nn.Linear(3, 3))
    with pytest.raises(nbgrad.ModulePathError) as caught:
        nbgrad.trace(plain, torch.ones(1, 3), "x = model.embedd.output.save()")
    assert "canonical" not in str(caught.value)
    assert_clean(plain, (0, [True, True], True, [None, None]))


LOOP = "for i in range({}):\n    model.transformer.h[i].output[:] *= 2"


@pytest.mark.parametrize("written, bad", [("5", 2), ("1, 3", 2), ("-3, 1", -3)])
def test_an_edit_whose_literal_range_runs_past_the_last_layer_is_refused_when_installed(written, bad):
    error = refused(tiny_gpt2(n_layer=2), lambda m, ns: nbgrad.edit(m, LOOP.format(written), ns, label="double"),
                    nbgrad.ModulePathError,
                    f"line 2: model.transformer.h[i].output is not in the model for i = {bad}: the loop of line 1 runs "
                    f"over range({written}), and model.transformer.h has 2 layers, indices 0–1")
    assert isinstance(error, AttributeError)


def test_an_edit_of_canonical_names_past_the_last_layer_is_said_in_the_cell_s_words():
    body = "for i in range(3):\n    model.layers[i].resid_post[:] *= 2\n    model.layers[i].mlp.output[:] *= 2"
    refused(tiny_gpt2(n_layer=2), lambda m, ns: nbgrad.edit(m, body, ns), nbgrad.ModulePathError,
            "line 2: model.layers[i].resid_post is not in the model for i = 2: the loop of line 1 runs over range(3), "
            "and model.transformer.h has 2 layers, indices 0–1 (model.transformer.h[i].output in the model's own paths)")


def test_the_magic_refuses_it_too(shell):
    refused_by_magic(shell, "edit", "model", LOOP.format(5), nbgrad.ModulePathError,
                     r"line 2: model.transformer.h\[i\].output is not in the model for i = 2: the loop of line 1 runs over "
                     r"range\(5\)")


def test_a_range_within_the_layers_installs_and_edits_as_plain_hooks_do():
    model = tiny_gpt2(n_layer=2)
    handles = [block.register_forward_hook(lambda mod, args, out: out * 2) for block in model.transformer.h]
    expected = model(IDS).logits
    for handle in handles:
        handle.remove()
    with nbgrad.edit(model, LOOP.format(2)):
        assert torch.allclose(model(IDS).logits, expected)


def test_a_range_known_only_at_the_call_names_the_edit_and_its_line_then():
    model = tiny_gpt2(n_layer=2)
    namespace, before = {"model": model, "n": 5}, model_state(model)
    edit = nbgrad.edit(model, LOOP.format("n"), namespace, label="double")
    try:
        with pytest.raises(nbgrad.ModulePathError) as caught:
            model(IDS)
    finally:
        edit.remove()
    assert str(caught.value) == ("line 2: model.transformer.h[i] is not in the model: model.transformer.h has 2 "
                                 "blocks, indices 0–1 (or -2–-1); raised by double, which is on the model: "
                                 "`.remove()` takes it off")
    assert_clean(model, before)
    namespace.pop("n")
    next_cell_works(model, namespace)
