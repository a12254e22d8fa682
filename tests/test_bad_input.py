"""Bad input is one clear message, never a traceback from inside the model or the engine; the model is
clean after each and the next cell works. Where PyTorch itself would fail, the test shows that too."""
import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

import nbgrad
from nbgrad.errors import ArgumentError
from helpers import assert_clean, model_state, tiny_gpt2


@pytest.fixture
def model():
    return tiny_gpt2(n_layer=2)


def refused(model, value, error_type, *fragments, **options):
    """trace() refuses `value` with a message holding every fragment; the model is clean after."""
    before = model_state(model)
    with pytest.raises(error_type) as caught:
        nbgrad.trace(model, value, "hs = model.transformer.h[0].output.save()", **options)
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message, message
    assert "\n" not in message
    assert_clean(model, before)
    ok = nbgrad.trace(model, torch.tensor([[1, 2, 3]]), "hs = model.transformer.h[0].output.save()")
    assert ok.saved["hs"].shape[:2] == (1, 3)
    return message


def test_empty_text(default_model):
    tokenizer = nbgrad.tokenizer_for(default_model)
    assert tokenizer("", return_tensors="pt")["input_ids"].shape[-1] == 0     # what the model would get
    refused(default_model, "", nbgrad.InputError, "INPUT is an empty string", "no text")
    refused(default_model, ["", ""], nbgrad.InputError, "INPUT is a list of empty strings", "no text")


def test_empty_list_and_empty_tensor(model):
    refused(model, [], nbgrad.InputError, "INPUT is an empty list", "at least one prompt")
    refused(model, torch.zeros(1, 0, dtype=torch.long), nbgrad.InputError, "INPUT is an empty tensor",
            "shape (1, 0)")


@pytest.mark.parametrize("value", [torch.tensor([[1, 97]]), {"input_ids": torch.tensor([[200, 1]])},
                                   torch.tensor([[-1, 3]])])
def test_ids_past_the_vocabulary(model, value):
    ids = value["input_ids"] if isinstance(value, dict) else value
    with pytest.raises(IndexError):         # plain PyTorch: "index out of range in self"
        model(ids)
    bad = int(ids.max()) if int(ids.max()) >= 97 else int(ids.min())
    refused(model, value, nbgrad.InputError, f"INPUT has token id {bad}", "outside the model's vocabulary",
            "model.transformer.wte.num_embeddings = 97", "0–96")


def test_float_ids_keep_torchs_error_with_a_note(model):
    """Token ids given as floats: the model's embedding refuses them (plain PyTorch says the same); the note
    says what INPUT was and how to give ids. Floats are not refused before the run: other models take them."""
    ids = torch.tensor([[1.0, 2.0, 3.0]])
    with pytest.raises(RuntimeError, match="'indices'"):
        model(ids)
    before = model_state(model)
    with pytest.raises(RuntimeError, match="'indices'") as caught:
        nbgrad.trace(model, ids, "hs = model.transformer.h[0].output.save()")
    assert caught.value.__notes__ == ["nbgrad: INPUT is a tensor of torch.float32, but the model looks token ids "
                                      "up in an embedding, and ids are integers: pass `ids.long()`, or give the "
                                      "text as a string"]
    assert_clean(model, before)
    assert nbgrad.trace(model, ids.long(), "hs = model.transformer.h[0].output.save()").saved["hs"].shape[1] == 3


def test_ids_past_the_position_limit(model):
    ids = torch.ones(1, 33, dtype=torch.long)
    with pytest.raises(IndexError):
        model(ids)
    refused(model, ids, nbgrad.InputError, "INPUT has 33 positions", "model.config.n_positions = 32")
    exactly = nbgrad.trace(model, torch.ones(1, 32, dtype=torch.long), "hs = model.transformer.h[1].output.save()")
    assert exactly.saved["hs"].shape == (1, 32, 32)


def test_a_rotary_model_is_not_held_to_its_configured_length():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=8)
    llama = LlamaForCausalLM(config).eval()
    ids = torch.arange(12).unsqueeze(0)
    expected = llama(ids).logits
    result = nbgrad.trace(llama, ids, "logits = model.lm_head.output.save()")
    assert torch.equal(result.saved["logits"], expected)
    with pytest.raises(nbgrad.InputError, match=r"model.model.embed_tokens.num_embeddings = 50"):
        nbgrad.trace(llama, torch.tensor([[3, 50]]), "x = model.lm_head.output.save()")


def test_plain_embedding_model_names_its_table():
    net = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 2))
    with pytest.raises(nbgrad.InputError) as caught:
        nbgrad.trace(net, torch.tensor([[3, 12]]), "out = model.output.save()")
    assert str(caught.value) == ("INPUT has token id 12, outside the model's vocabulary: "
                                 "model[0].num_embeddings = 10, so ids are 0–9")


def test_trace_of_something_that_is_not_a_module(model):
    with pytest.raises(ArgumentError) as caught:
        nbgrad.trace(None, torch.tensor([[1]]), "x = model.output")
    assert str(caught.value) == ("the model to trace is None, not a torch.nn.Module: pass the module itself "
                                 "(e.g. `model = nbgrad.load_model()`)")
    with pytest.raises(ArgumentError, match=r"the model to trace is a str `'model'`, not a torch.nn.Module"):
        nbgrad.trace("model", torch.tensor([[1]]), "x = model.output")


def test_namespace_that_is_not_a_dict(model):
    before = model_state(model)
    for call in (lambda: nbgrad.trace(model, torch.tensor([[1]]), "x = model.output", [("model", model)]),
                 lambda: nbgrad.backward(torch.ones(2, requires_grad=True).sum(), "", ["x"])):
        with pytest.raises(ArgumentError) as caught:
            call()
        assert str(caught.value).startswith("namespace is a list")
        assert "not a dict: pass the dict of names the cell reads and binds" in str(caught.value)
    assert_clean(model, before)


def test_grad_output_of_the_wrong_shape(shell):
    shell.run_cell("go_x = torch.ones(3, requires_grad=True)")
    with pytest.raises(RuntimeError, match="Mismatch in shape"):     # plain PyTorch
        (torch.ones(3, requires_grad=True) * 2).backward(torch.ones(4))
    with pytest.raises(nbgrad.GradError) as caught:
        shell.run_line_magic("backward", "go_x * 2 --grad-output torch.ones(4) -q")
    assert str(caught.value) == ("--grad-output (grad_output=) has shape (4,), but LOSS has shape (3,): the vector "
                                 "of a vector-Jacobian product has the shape of LOSS")
    assert shell.user_ns["go_x"].grad is None
    with pytest.raises(nbgrad.GradError, match=r"has shape \(2, 2\), but LOSS has shape \(3,\)"):
        nbgrad.backward(shell.user_ns["go_x"] * 2, grad_output=torch.ones(2, 2))
    with pytest.raises(ArgumentError, match=r"--grad-output \(grad_output=\) is a list `\[1, 1, 1\]`, not a tensor"):
        nbgrad.backward(shell.user_ns["go_x"] * 2, grad_output=[1, 1, 1])


def test_backward_of_something_that_is_not_a_tensor(shell):
    with pytest.raises(ArgumentError) as caught:
        shell.run_cell_magic("backward", "5", "pass")
    assert str(caught.value) == ("LOSS is an int `5`, not a tensor: give the tensor to backpropagate from "
                                 "(e.g. `loss` or `logits.sum()`)")
    assert "caused by" not in "".join(caught.value._render_traceback_())
    with pytest.raises(ArgumentError, match=r"^LOSS is a str `'loss'`, not a tensor"):
        shell.run_line_magic("backward", "'loss'")


# --- a loss that does not require grad: name what it came from, never an unrelated tensor -------------

HEAD = "the loss does not require grad, so there is nothing to backpropagate: "


def test_a_constant_loss_blames_itself_not_the_namespace(shell):
    shell.run_cell("unrelated = torch.ones(3)\nalso_unrelated = torch.zeros(2)")
    with pytest.raises(RuntimeError, match="does not require grad"):
        torch.ones(()).backward()
    with pytest.raises(nbgrad.GradError) as caught:
        shell.run_cell_magic("backward", "torch.ones(())", "pass")
    message = str(caught.value)
    assert message.startswith(HEAD + "the loss itself is a tensor that does not require grad (it has no grad_fn)")
    assert "unrelated" not in message


def test_loss_expression_names_the_tensors_it_reads(shell):
    shell.run_cell("na = torch.ones(3)\nnb = torch.ones(3) * 2\nbystander = torch.ones(5)")
    with pytest.raises(nbgrad.GradError) as caught:
        shell.run_line_magic("backward", "(na * nb).sum() -q")
    assert str(caught.value) == (HEAD + "it is computed from na, nb, which have requires_grad=False; create them "
                                 "with requires_grad=True (or call .requires_grad_())")


def test_a_named_loss_without_history_is_named(shell):
    shell.run_cell("nc = torch.ones(3)\nloss_ng = (nc * 2).sum()")
    with pytest.raises(nbgrad.GradError) as caught:
        shell.run_line_magic("backward", "loss_ng -q")
    message = str(caught.value)
    assert message.startswith(HEAD + "loss_ng is a tensor that does not require grad (it has no grad_fn)")
    assert "computed from nc" not in message
    assert "torch.no_grad()" in message and "requires_grad=True" in message


def test_a_loss_built_under_no_grad(shell):
    shell.run_cell("leaf = torch.tensor([1.0, 2.0], requires_grad=True)\n"
                   "with torch.no_grad():\n    ng_loss = (leaf * 3).sum()")
    with pytest.raises(RuntimeError, match="does not require grad"):    # plain PyTorch refuses it too
        shell.user_ns["ng_loss"].backward()
    with pytest.raises(nbgrad.GradError) as caught:
        shell.run_line_magic("backward", "ng_loss -q")
    assert "ng_loss is a tensor that does not require grad" in str(caught.value)
    assert "computed under torch.no_grad()" in str(caught.value)
    with pytest.raises(nbgrad.GradError) as caught:
        shell.run_line_magic("backward", "(leaf * 3).detach().sum() -q")
    assert str(caught.value) == (HEAD + "what it is computed from requires grad, but the loss has no grad_fn: it was "
                                 "computed under torch.no_grad() / --no-grad or through .detach(); compute it with "
                                 "grad enabled")
    assert shell.user_ns["leaf"].grad is None


def test_api_backward_of_a_loss_without_grad_names_the_loss(model):
    x = torch.ones(2, requires_grad=True)
    with torch.no_grad():
        loss = (x * 2).sum()
    namespace = {"x": x, "loss": loss, "other": torch.ones(4)}
    with pytest.raises(nbgrad.GradError) as caught:
        nbgrad.backward(loss, "", namespace)
    assert str(caught.value).startswith(HEAD + "loss is a tensor that does not require grad")
    assert "other" not in str(caught.value) and x.grad is None


def test_trace_loss_built_under_no_grad_in_the_cell(model):
    ids = torch.tensor([[1, 2, 3]])
    before = model_state(model)
    with pytest.raises(nbgrad.GradError) as caught:
        nbgrad.trace(model, ids, "logits = model.output.logits\nwith torch.no_grad():\n    loss = logits.sum() * 2\n"
                                 "loss.backward()", {"model": model, "torch": torch, "spare": torch.ones(2)})
    message = str(caught.value)
    assert message.startswith("line 4: " + HEAD + "loss is a tensor that does not require grad (it has no grad_fn)")
    assert "torch.no_grad()" in message and "spare" not in message
    assert_clean(model, before)


def test_trace_loss_from_a_plain_tensor_names_it(model):
    with pytest.raises(nbgrad.GradError) as caught:
        nbgrad.trace(model, torch.tensor([[1, 2]]), "h = model.transformer.h[0].output\n(w * 2).sum().backward()",
                     {"model": model, "w": torch.ones(3), "spare": torch.ones(2)})
    assert str(caught.value) == ("line 2: " + HEAD + "it is computed from w, which has requires_grad=False; create it "
                                 "with requires_grad=True (or call .requires_grad_())")
