"""`nbgrad.generate` and `%%generate`: transformers' own `model.generate` drives the loop, and the cell's
compiled program runs once per forward call of the model (a step), each step a fresh run of the hook
graph with `step` bound in the namespace. What a step saved is kept; after the cell each saved name
holds a list indexed by step.

    before generate   open step 0: snapshot, hooks on the events the graph names, `step` bound
    model called      (a pre-hook ahead of every other) start the step
    model returned    (a hook after the step's own) finish it, keep what it saved, close it, open the next
    after generate    close the step left open; bind every saved name to its list by step
"""
from __future__ import annotations

import numbers

import torch
from torch import nn

from . import models
from .engine.compile.helpers import compile_with_helpers
from .engine import checks
from .errors.options import checked_options
from .engine.compile.pasted import rewritten
from .engine.compile.sourcetext import check_source
from .engine.moduletree import compiled_inner
from .engine.results.result import Result, holds_saved
from .engine.run.rows import InvokeRows
from .engine.run.runtime import Runtime
from .errors import GradError, InputError, NbgradError
from .errors.naming import a_or_an
from .models.batching import batch_invokes
from .models.cell import call_options, default_namespace, invoke_inputs
from .models.inputs import INPUT_HELP, call_arguments, input_ids_of
from .models.wrongcall import input_noted
from .names import rewrite_of
from .names.misspelt import root_misspelling_hinted
from .names.rewrite import eager_attention, in_cell_words

STEP_NAME = "step"
TOP_K = 5
NO_GRAD = ("%%generate runs under torch.no_grad(), as transformers' generate does: for gradients of a "
           "continuation, %%trace the generated ids (bound by --out NAME)")
_MISSING = object()


class GenerationResult(Result):
    """A `Result` whose saved values are lists indexed by step, with the generated token ids."""
    FIELDS = Result.FIELDS + ("output", "top_next")

    def __init__(self, saved: dict, graph, *fields, output=None, top_next=None, **named):
        super().__init__(saved, graph, *fields, **named)
        self.output = output                                 # token ids, prompt included
        # per step: (ids, probs) [rows, k] of the next token, or None
        self.top_next = [] if top_next is None else top_next

    def without(self, names) -> GenerationResult:
        """`Result.without`, with a list of steps' top tokens of its own."""
        rest = super().without(names)
        rest.top_next = list(self.top_next)
        return rest


@checked_options("nbgrad.generate")
@root_misspelling_hinted
def generate(model: nn.Module, input, source: str, namespace: dict | None = None, max_new_tokens: int = 20, *,
             sample: bool = False, out: str | None = None, kwargs: dict | None = None, tokenizer=None,
             graph: bool = False, quiet: bool = True) -> GenerationResult:
    """Run `source` (the body of a `%%generate` cell) at every forward call of `model.generate(input)`."""
    if not isinstance(model, nn.Module) and hasattr(model, "nbgrad_generate"):   # a model elsewhere: every option to it
        return model.nbgrad_generate(input, source, namespace, **call_options(locals()))
    _check_cell(source, namespace, tokenizer)
    source = rewritten(source, namespace, max_new_tokens)      # pasted nnsight code (engine/compile/pasted.py)
    if (rewrite := rewrite_of(source, model, namespace)).eager and not graph:     # canonical names (nbgrad/names)
        return _eagerly(model, {**locals(), "source": rewrite.text})
    program = compile_with_helpers(rewrite.text, "trace", namespace)
    if graph:
        return GenerationResult(saved={}, graph=program.graph)
    namespace = default_namespace(namespace, model)
    tokenizer = tokenizer or models.tokenizer_for(model)
    model = compiled_inner(model) or model
    _check_arguments(model, max_new_tokens, kwargs)
    models.remember(model)
    options = {"max_new_tokens": max_new_tokens, "do_sample": sample, **_pad_token(model, tokenizer),
               **(kwargs or {})}
    values, spans = [], None
    if program.invokes:
        values = invoke_inputs(program, input, namespace, "%%generate")
        args, call_kwargs, spans = batch_invokes(values, program.invokes, model, tokenizer)
        call_kwargs.pop("position_ids", None)      # generate makes them from the mask at every step
        _one_sequence_per_row(options, program.invokes[0].line)
    elif input is None:
        raise InputError(f"missing INPUT: write `%%generate MODEL INPUT`, or put `with invoke(INPUT):` blocks in "
                         f"the cell. {INPUT_HELP}")
    else:
        args, call_kwargs = _arguments(input, model, tokenizer)
    with in_cell_words(rewrite), input_noted(input, args, call_kwargs):    # a canonical name as the cell wrote it
        result = Generation(program, namespace, model, spans).run(args, {**call_kwargs, **options})
    result.input_ids = input_ids_of(args, call_kwargs)
    result.invokes = values
    if out:
        namespace[out] = result.output
    return result


def _check_cell(source, namespace, tokenizer) -> None:
    check_source(source, "nbgrad.generate")
    checks.namespace_argument(namespace)
    checks.tokenizer_argument(tokenizer)


def _check_arguments(model: nn.Module, max_new_tokens, kwargs) -> None:
    if not callable(getattr(model, "generate", None)):
        raise NbgradError(f"%%generate needs a model with transformers' `generate` (a generative model); "
                          f"{type(model).__name__} has none. Use %%trace for a single forward call")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, numbers.Integral) or max_new_tokens < 1:
        raise InputError(f"--max-new-tokens (max_new_tokens=) is how many tokens to generate, a whole number of at "
                         f"least 1, not {max_new_tokens!r}")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise InputError(f"--kwargs must be a dict of `generate` keywords, not {a_or_an(type(kwargs).__name__)}")


class Generation:
    """One generation with the cell's hook graph in place. Create, call `run`, discard."""

    def __init__(self, program, namespace: dict, model: nn.Module, spans: list | None = None):
        self.program, self.ns, self.model = program, namespace, model
        self.spans = spans               # [start, stop) of each invoke's rows, when the cell has invokes
        self.runtime = None              # the step opened, or running now
        self.step = 0
        self.running = False             # between the model call's start and its return
        self.saved: list = []            # per step: the step's Result.saved
        self.bound: list = []            # per step: {name: value} of the names that held what it saved
        self.top_next: list = []
        self.shapes: dict = {}
        self.saved_invokes: dict = {}    # saved name -> the invoke whose block saved it
        self._step_before = namespace.get(STEP_NAME, _MISSING)
        # what the cell's names held before it: a failed generation gives them back (SPEC §4: it binds no name)
        self._names_before = {name: namespace.get(name, _MISSING) for name in program.bound_names}

    def run(self, args: tuple, kwargs: dict) -> GenerationResult:
        __tracebackhide__ = True
        grad_mode, failed = torch.is_grad_enabled(), True
        try:
            with torch.no_grad():        # from the first snapshot on: each step gives back the grad mode it found
                self._open()
                output = self.model.generate(*args, **kwargs)
            failed = False
        except BaseException as error:
            raise self._failed(error)
        finally:
            try:
                self._close(grad_mode, failed)
            finally:
                self._close(grad_mode, failed)    # again: every step is idempotent, and an interrupt may cut the first
        names = list(dict.fromkeys(name for saved in self.saved for name in saved))
        return GenerationResult(saved={name: [saved.get(name) for saved in self.saved] for name in names},
                                graph=self.program.graph, shapes=self.shapes, saved_invokes=self.saved_invokes,
                                output=getattr(output, "sequences", output), top_next=self.top_next)

    # --- steps ----------------------------------------------------------------------------------

    def _open(self) -> None:
        self.ns[STEP_NAME] = self.step
        rows = InvokeRows(self.spans, self.spans[-1][1]) if self.spans else None
        self.runtime = Runtime(self.program, self.ns, model=self.model, no_grad=True, rows=rows)
        self.runtime.open_step()
        # The step's own hook set holds the hooks that start and finish it, so they go with its other hooks.
        # Starting comes before every other pre-hook; finishing after the step's hooks, registered before it.
        hooks, model = self.runtime.hooks, self.model
        hooks.add("step starts", lambda: model.register_forward_pre_hook(self._on_call, prepend=True))
        hooks.add("step ends", lambda: model.register_forward_hook(self._on_return))

    def _on_call(self, module, args):
        if self.running or self.runtime.in_statement:
            return None          # a call the cell's own code makes: not a step
        self.running = True
        self.runtime.start_step()
        return None

    def _on_return(self, module, args, output):
        runtime = self.runtime
        if not self.running or runtime.in_statement:
            return None
        self._keep(runtime.finish_step(), output)
        runtime.close()
        self.running = False
        self.step += 1
        self._open()
        return None

    def _keep(self, result: Result, output) -> None:
        saved_ids = {id(value) for value in result.saved.values()}
        self.saved.append(result.saved)
        self.bound.append({name: self.ns[name] for name in sorted(self.program.bound_names)
                           if name in self.ns and holds_saved(self.ns[name], saved_ids)})
        self.shapes = result.shapes
        self.saved_invokes.update(result.saved_invokes)
        self.top_next.append(_top_next(output))

    # --- the end --------------------------------------------------------------------------------

    def _failed(self, error: BaseException) -> BaseException:
        shown = self.runtime.close(error) if self.runtime is not None else error
        if self.running:
            _at_step(shown, self.step)
        return shown

    def _close(self, grad_mode: bool, failed: bool) -> None:
        """The open step first (its hooks, so nothing of ours fires again), then `step`, the saved lists (after a
        failure, the names as they were before the cell) and grad mode."""
        if self.runtime is not None:
            self.runtime.close()
        self.running = False
        if self._step_before is _MISSING:
            self.ns.pop(STEP_NAME, None)
        else:
            self.ns[STEP_NAME] = self._step_before
        for name, value in self._names_before.items() if failed else ():
            if value is _MISSING:
                self.ns.pop(name, None)
            else:
                self.ns[name] = value
        for name in dict.fromkeys(name for bound in self.bound for name in bound) if not failed else ():
            self.ns[name] = [bound.get(name) for bound in self.bound]
        torch.set_grad_enabled(grad_mode)


def _one_sequence_per_row(options: dict, line: int) -> None:
    """Invoke blocks address rows of the batch: beams or several sequences per prompt would multiply them."""
    for name in ("num_beams", "num_return_sequences"):
        if (options.get(name) or 1) > 1:
            raise InputError(f"invoke blocks in %%generate take one sequence per prompt, so {name}="
                             f"{options[name]} cannot be used with them; generate each prompt in a cell of its own",
                             line)


def _arguments(input, model: nn.Module, tokenizer) -> tuple:
    """The call arguments; prompts of different lengths padded on the left (as every list INPUT is), so each
    row's new tokens follow its own last token."""
    args, kwargs = call_arguments(input, model, tokenizer)
    kwargs.pop("position_ids", None)      # generate makes them from the mask at every step
    return args, kwargs


def _top_next(output):
    """(ids, probs) of the most likely next tokens per row, from the model's logits at the last position."""
    logits = getattr(output, "logits", None)
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3 or not logits.is_floating_point():
        return None
    probs = logits[:, -1].detach().float().softmax(dim=-1)
    values, ids = probs.topk(min(TOP_K, probs.shape[-1]), dim=-1)
    return ids.cpu(), values.cpu()


def _at_step(error: BaseException, step: int) -> None:
    """Say at which step of the generation an error was raised."""
    if isinstance(error, NbgradError):
        error.detail = f"{error.detail} (at generation step {step})"
        if isinstance(error, GradError):
            error.detail += f". {NO_GRAD}"
        error.args = (f"line {error.line}: {error.detail}" if error.line else error.detail,) + error.args[1:]
    elif isinstance(error, Exception):
        error.add_note(f"nbgrad: raised at generation step {step}")


def _eagerly(model, arguments: dict) -> GenerationResult:
    """`generate` of a cell rewritten from canonical names that reads attention patterns: with the eager
    attention function, given back afterwards."""
    arguments.pop("rewrite")
    with eager_attention(model):
        return generate(**arguments)


def _pad_token(model: nn.Module, tokenizer) -> dict:
    """`pad_token_id` for a model whose generation config has none (transformers warns otherwise)."""
    config = getattr(model, "generation_config", None)
    if config is None or config.pad_token_id is not None:
        return {}
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        pad = config.eos_token_id[0] if isinstance(config.eos_token_id, list) else config.eos_token_id
    return {} if pad is None else {"pad_token_id": pad}
