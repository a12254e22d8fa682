"""IPython magics: each parses its line and calls the engine; what they do around a run (find MODEL, show the
Result, explain an unsaved name) is in cells.py. No engine logic here."""
from __future__ import annotations

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_cell_magic, line_magic, magics_class, no_var_expand
from IPython.core.magic_arguments import argument, kwds, magic_arguments

from .. import api
from ..engine import checks
from ..errors import NbgradError, for_the_cell
from ..errors.naming import a_or_an
from .cells import explain_unsaved, model_named, show_result
from .graph import show_graph
from .magic_line import evaluate, split_expression
from .over import dataset_options, over_arguments, trace_over_line
from .provenance import footed


def _cell_errors(magic):
    """Let a body error surface with the cell's own frames only; nbgrad errors render as one message."""
    import functools

    @functools.wraps(magic)
    def wrapper(self, line, cell=""):
        __tracebackhide__ = True
        try:
            return magic(self, line, cell)
        except BaseException as error:
            raise for_the_cell(error)
    return wrapper


@magics_class
class NbgradMagics(Magics):

    @magic_arguments()      # usage: argparse prints %% as %, and IPython puts one more % in front
    @kwds(usage="%%trace MODEL [INPUT] [--no-grad] [-q] [--graph] [--tokenizer EXPR] [--over DATASET "
                "[--batch-size N] [--column NAME] [--out DIR] [--engine local|ray] [--workers N] [--model-factory EXPR]]")
    @argument("model", help="name of a torch.nn.Module in the notebook's namespace")
    @argument("input", nargs="?", help="Python expression: a string or list of strings (tokenized), "
                                        "a tensor, a dict / BatchEncoding (keyword arguments) or a tuple")
    @argument("--no-grad", action="store_true", help="run under torch.no_grad()")
    @argument("-q", "--quiet", action="store_true", help="no inline display")
    @argument("--graph", action="store_true", help="show the hook graph of the cell and do not run it")
    @argument("--tokenizer", default=None, help="expression for the tokenizer of a text INPUT")
    @over_arguments
    @no_var_expand
    @cell_magic
    @_cell_errors
    def trace(self, line, cell):
        """Run the cell's intervention code on MODEL called with INPUT."""
        __tracebackhide__ = True
        head, _, rest = line.strip().partition(" ")
        if not head:
            raise UsageError("usage: %%trace MODEL INPUT [options]; see %%trace?")
        input_text, args = split_expression(rest, self.trace, head)
        namespace = self.shell.user_ns
        model = self._model(head)
        if args.graph:
            return show_graph(api.trace(model, None, cell, namespace, graph=True).graph, f"%%trace {line.strip()}")
        tokenizer = self._evaluate(args.tokenizer, "--tokenizer") if args.tokenizer else None
        if args.over is not None:
            return trace_over_line(self, model, head, input_text, args, cell, tokenizer)
        checks.dataset_options_alone(**dataset_options(args))      # before INPUT is evaluated: nothing runs
        value = self._evaluate(input_text, "INPUT") if input_text is not None else None
        result = api.trace(model, value, cell, namespace, no_grad=args.no_grad, tokenizer=tokenizer)
        show_result(self.shell, result, args.quiet, model, f"%%trace {line.strip()}")
        return None

    @magic_arguments()
    @kwds(usage="%%backward LOSS [--grad-output EXPR] [--retain-graph] [--create-graph] [-q] [--graph]")
    @argument("loss", help="expression for the tensor to backpropagate from")
    @argument("--grad-output", default=None, help="expression: the vector of a vector-Jacobian product")
    @argument("--retain-graph", action="store_true", help="keep the graph for another backward pass")
    @argument("--create-graph", action="store_true", help="record the backward pass for higher-order gradients")
    @argument("-q", "--quiet", action="store_true", help="no inline display")
    @argument("--graph", action="store_true", help="show the hook graph of the cell and do not run it")
    @no_var_expand
    @line_cell_magic
    @_cell_errors
    def backward(self, line, cell=""):
        """A standalone backward pass of LOSS; the body reads and edits `.grad` of any tensor.
        With no body, use the line form `%backward LOSS [options]`."""
        __tracebackhide__ = True
        loss_text, args = split_expression(line, self.backward, "_")
        if loss_text is None:
            raise UsageError("usage: %%backward LOSS [options]; see %%backward?")
        namespace = self.shell.user_ns
        if args.graph:
            return show_graph(api.backward(None, cell, namespace, graph=True).graph, f"%%backward {line.strip()}")
        loss = self._evaluate(loss_text, "LOSS")
        grad_output = self._evaluate(args.grad_output, "--grad-output") if args.grad_output else None
        if not getattr(loss, "nbgrad_kept", None):       # a remote cell's value has its graph on the actor
            checks.loss_requires_grad(loss, namespace, loss_text)
        result = api.backward(loss, cell, namespace, grad_output=grad_output, retain_graph=args.retain_graph,
                              create_graph=args.create_graph)
        show_result(self.shell, result, args.quiet, None, f"%%backward {line.strip()}")
        return None

    @magic_arguments()
    @argument("model", help="name of a generative transformers model in the notebook's namespace")
    @argument("input", nargs="?", help="Python expression: the prompt (a string or list of strings, "
                                        "tokenized), token ids, or a dict / BatchEncoding")
    @argument("--max-new-tokens", type=int, default=20, help="how many tokens to generate (default 20)")
    @argument("--sample", action="store_true", help="sample instead of greedy decoding")
    @argument("--out", default=None, type=str, help="name to bind the generated token ids to (prompt included)")
    @argument("--kwargs", default=None, help="expression: a dict of further `generate` keywords")
    @argument("-q", "--quiet", action="store_true", help="no inline display")
    @argument("--graph", action="store_true", help="show the hook graph of the cell and do not run it")
    @argument("--tokenizer", default=None, help="expression for the tokenizer of a text INPUT")
    @no_var_expand
    @line_cell_magic
    @_cell_errors
    def generate(self, line, cell=""):
        """Generate from MODEL with transformers' `generate`, running the cell at every forward call of
        the model (`step` = 0 for the prompt, then one per new token). Saved names hold a list by step.
        With no body (`%generate MODEL INPUT [options]`, or an empty `%%generate` cell): a plain generation."""
        __tracebackhide__ = True
        from .generate import generate_line
        return generate_line(self, line, cell, self.generate, cell_form=cell != "")

    @line_magic
    def show(self, line):
        """%show EXPR: the inline panel for a tensor, or a dict / list of tensors."""
        from IPython.display import display
        expression = line.strip()
        if not expression:
            raise UsageError("usage: %show EXPR (a tensor, or a dict / list of tensors)")
        display(footed(api.show(self._evaluate(expression, "EXPR"), name=expression), None, f"%show {expression}"))

    @line_magic
    def gradflow(self, line):
        """%gradflow MODEL: per-layer gradient norms after a backward pass, vanishing / exploding flagged."""
        from IPython.display import display
        from ..views.gradflow import GradFlow
        name = line.strip()
        if not name:
            raise UsageError("usage: %gradflow MODEL (after a backward pass: its per-layer gradient norms)")
        display(footed(GradFlow(self._model(name), name), self._model(name), f"%gradflow {name}"))

    @line_magic
    def gradgraph(self, line):
        """%gradgraph EXPR: the autograd graph behind a tensor, leaves named from the namespace."""
        import torch
        from IPython.display import display
        from ..errors.naming import tensor_names
        from ..views.gradgraph import GradGraph
        expression = line.strip()
        if not expression:
            raise UsageError("usage: %gradgraph EXPR (a tensor: the autograd graph behind it)")
        value = self._evaluate(expression, "EXPR")
        if not isinstance(value, torch.Tensor):
            raise NbgradError(f"%gradgraph needs a tensor; `{expression}` is {a_or_an(type(value).__name__)}")
        view = GradGraph(value, tensor_names(self.shell.user_ns), expression)
        display(footed(view, None, f"%gradgraph {expression}"))

    @magic_arguments()
    @argument("model", help="name of a torch.nn.Module in the notebook's namespace")
    @argument("input", nargs="?", help="Python expression: the prompt (one string, ids, or a dict)")
    @argument("--target", default=None, help="expression: a token (string; its first token id), a token id, "
                                              "or a callable logits -> scalar")
    @argument("--method", default="ig", choices=["ig", "saliency", "grad-x-input"], help="default: ig")
    @argument("--steps", type=int, default=64, help="interpolation points of integrated gradients")
    @argument("--site", default=None, type=str,     # a dotted path (transformer.h.3), not a Python expression
              help="module path whose output is attributed (default: input embeddings)")
    @argument("--baseline", default=None, help="expression: zeros by default, a tensor, or a prompt of the same "
                                                "length")
    @argument("--batch-size", type=int, default=16, help="interpolation points run at a time")
    @line_magic
    @_cell_errors
    def attribute(self, line, cell=""):
        """Token attribution for one prediction, shown as a token heatmap; returns the Attribution
        (`a = %attribute ...` keeps it). Same as `nbgrad.attribute`."""
        __tracebackhide__ = True
        from .attribute import attribute_line
        return attribute_line(line, self.attribute, self._model, self._evaluate)

    @line_magic
    def nbgrad(self, line):
        """Version, extension state, models seen, hooks live."""
        from . import status
        if line.strip():
            raise UsageError(f"%nbgrad takes nothing after it, not `{line.strip()}`: it reports the version, the "
                             f"extension, the models seen, the hooks live and the active edits")
        print(status.report(self.shell.user_ns))

    # helpers (notebook/cells.py), as methods for the magics' own modules (generate.py, over.py)
    def _model(self, name: str):
        return model_named(self.shell.user_ns, name)

    def _evaluate(self, text: str, what: str):
        return evaluate(text, self.shell.user_ns, what)


def load(ipython) -> None:
    ipython.register_magics(NbgradMagics)
    from .magic_source import SourceMagics
    ipython.register_magics(SourceMagics)
    from .magic_edit import EditMagics
    ipython.register_magics(EditMagics)
    ipython.set_custom_exc((NameError,), explain_unsaved)
    from .generate import empty_body_as_line
    if empty_body_as_line not in ipython.input_transformers_cleanup:
        ipython.input_transformers_cleanup.append(empty_body_as_line)
    from . import comm
    comm.register(ipython)


def unload(ipython) -> None:
    ipython.set_custom_exc((), None)
    from .generate import empty_body_as_line
    if empty_body_as_line in ipython.input_transformers_cleanup:
        ipython.input_transformers_cleanup.remove(empty_body_as_line)
