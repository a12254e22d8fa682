"""Ctrl-C at any line: a KeyboardInterrupt injected at the k-th line event of nbgrad's own code or of the
cell, through `nbgrad.trace` and through the `%%trace` magic, for k from the first line until the cell
completes without one. After each: no hook of any kind on the model, its parameters or the values the
cell made; flags and grad mode as before; no `__nbgrad__` in the namespace; no runtime left active; and
the next cell's values equal plain PyTorch.

`make test` tries each line of nbgrad's set-up and clean-up functions (its first run in the cell) and
every `STRIDE`-th other line event, with the cell compiled once; `NBGRAD_INTERRUPT_FULL=1` (`make fuzz`) tries every line, compile included: each
line's first and last event and every event of set-up and clean-up; `NBGRAD_INTERRUPT_FULL=events` every k (hours).
"""
import contextlib
import functools
import time
import warnings

import pytest
import torch

import nbgrad
from nbgrad.engine.compile import compiler
from nbgrad.engine.run import runtime
from nbgrad.engine.run.runtime import active_runtime
from helpers import hook_count, tensor_hook_count, tiny_gpt2
from interrupts import FULL_MODE, Injector, points

FULL = FULL_MODE != ""
STRIDE = 40

CELLS = {
    "forward": ("hs = model.transformer.h[0].output.save()\n"
                "model.transformer.h[1].output[:] *= 2\n"
                "logits = model.output.logits.save()\n"),
    "backward": ("hs = model.transformer.h[0].output\n"
                 "with model.output.logits.sum().backward():\n"
                 "    g = hs.grad.save()\n"),
    "cache": ("c = cache(grads=True, dtype=torch.float16)\n"
              "outs = [b.output.save() for b in reversed(model.transformer.h)]\n"
              "model.output.logits.sum().backward()\n"),
    "stop": "hs = model.transformer.h[0].output.save()\nstop()\n",
    "loop": ("outs = [b.output.save() for b in reversed(model.transformer.h)]\n"
             "model.transformer.h[0].output = model.transformer.h[0].output * 2\n"),
    # a loop that only edits each block's output: its body runs from each block's event (a HookLoop's Steps)
    "edit loop": ("for i in range(len(model.transformer.h)):\n"
                  "    model.transformer.h[i].output[:, 0] *= 2\n"
                  "logits = model.output.logits.save()\n"),
    # a list of each block's saved output: each block's value saved from its event (a HookLoop of a list)
    "list": "outs = [b.output[:, -1].save() for b in model.transformer.h]\nlogits = model.output.logits.save()\n",
    # read and kept only: its events are logged in the forward and its statements run on the log (Program.quiet)
    "quiet": ("outs = [model.transformer.h[i].output.save() for i in reversed(range(len(model.transformer.h)))]\n"
              "last = model.transformer.h[-1].output.save()\n"),
    # one read, saved: answered by its hook, with no statement run (run/onesave.py)
    "one save": "hs = model.transformer.h[-1].output.save()\n",
    # a method of an object whose class the cell defines: its body pauses at its events (compile/methods.py)
    "method": ("class Scale:\n"
               "    def __init__(self, factor):\n"
               "        self.factor = factor\n"
               "    def apply(self, i):\n"
               "        model.transformer.h[i].output[:] *= self.factor\n"
               "        return model.transformer.h[i].output[:, -1].save()\n"
               "scale = Scale(2)\n"
               "hs = scale.apply(0)\n"
               "logits = model.output.logits.save()\n"),
    # invokes made in a loop, laid out before the run (compile/unroll.py); the cell has no INPUT
    "invoke loop": ("outs = []\n"
                    "for i in range(2):\n"
                    "    with invoke(interrupt_ids):\n"
                    "        model.transformer.h[i].output[:, 0] = 0\n"
                    "        outs.append(model.lm_head.output[:, -1].save())\n"),
    # a patch in an invoke that waits for the other's value: its on-event statement made before the model, started
    # inside the forward (run/hookloops.py, start_one's `ahead`)
    "patch": ("with invoke(interrupt_ids):\n"
              "    clean = model.transformer.h[0].output[:, -1].save()\n"
              "with invoke(interrupt_ids):\n"
              "    model.transformer.h[0].output[:, -1] = clean\n"
              "    patched = model.lm_head.output[:, -1].save()\n"),
    # canonical names (nbgrad/names): a rewrite, and the eager attention switch that `pattern` turns on for the cell
    "canonical": ("outs = [model.layers[i].resid_post.save() for i in range(model.n_layers)]\n"
                  "model.layers[1].resid_mid[:, 0] = 0\n"
                  "last = model.layers[0].attn.pattern.save()\n"
                  "with model.logits.sum().backward():\n"
                  "    g = model.layers[0].resid_pre.grad.save()\n"),
}
CHECK = ("after = model.transformer.h[0].output.save()\n"
         "model.transformer.h[1].output[:, 0] = 0\n"
         "with model.output.logits.sum().backward():\n"
         "    after_grad = after.grad.save()\n")
IDS = torch.tensor([[5, 9, 2, 7]])
INVOKES = "with invoke("         # a cell of invokes takes no INPUT
CELL_NAMES = ("hs", "logits", "g", "after", "after_grad", "c", "outs", "last", "i", "scale", "Scale", "clean",
              "patched")      # what the cells above bind
# cells that run as a direct run (runner="fast": the fast statement kinds, engine/run/runtime.py)
# cells compiled against the notebook's names (a class's methods, a loop's invokes, the model's canonical paths)
COMPILED_WITH_NAMES = ("canonical", "invoke loop", "method")
DIRECT = ("backward", "edit loop", "forward", "list", "loop", "one save", "quiet")


def plain_check(model):
    """CHECK done with raw hooks: h[0]'s output and its gradient, with h[1]'s first position zeroed."""
    kept = {}

    def keep(module, args, output):
        kept["after"] = output
        output.register_hook(lambda grad: kept.setdefault("after_grad", grad))

    def zero(module, args, output):
        output[:, 0] = 0
    handles = [model.transformer.h[0].register_forward_hook(keep), model.transformer.h[1].register_forward_hook(zero)]
    try:
        model(IDS).logits.sum().backward()
    finally:
        for handle in handles:
            handle.remove()
        model.zero_grad(set_to_none=True)
    return kept


class Spy:
    """Keeps every value each module returns (plain forward hooks, no nbgrad lines), so the values the
    cell made can be checked for tensor hooks even when the cell never bound them."""

    def __init__(self, model):
        self.values = []
        self.handles = [module.register_forward_hook(self._keep) for module in model.modules()]

    def _keep(self, module, args, output):
        self.values.extend(_tensors(output))

    def remove(self):
        for handle in self.handles:
            handle.remove()


def _tensors(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors(item)]
    return []


def problems_after(model, namespace, flags, spy) -> list:
    found = []
    if hook_count(model):
        found.append(f"{hook_count(model)} hooks left on the model or its parameters")
    if [p.requires_grad for p in model.parameters()] != flags:
        found.append("requires_grad flags changed")
    if not torch.is_grad_enabled():
        found.append("grad mode left off")
    if active_runtime() is not None:
        found.append("a runtime is still active")
    temporary = [n for n in namespace if n.startswith("__nbgrad")]     # nothing of ours is left
    if temporary:
        found.append(f"left in the namespace: {temporary}")
    values = spy.values + [namespace[n] for n in CELL_NAMES if isinstance(namespace.get(n), torch.Tensor)]
    hooked = sum(tensor_hook_count(v) for v in values)
    if hooked:
        found.append(f"{hooked} tensor hooks left on values the cell made")
    return found


def next_cell_problems(model, run) -> list:
    namespace = run(CHECK)
    expected = plain_check(model)
    if not torch.equal(namespace["after"], expected["after"]):
        return ["the next cell's value differs from plain PyTorch"]
    if not torch.allclose(namespace["after_grad"], expected["after_grad"], atol=1e-6):
        return ["the next cell's gradient differs from plain PyTorch"]
    return []


def api_runner(model, runner="fast"):
    def run(cell):
        namespace = {"model": model, "torch": torch, "interrupt_ids": IDS}
        run.namespace = namespace
        nbgrad.trace(model, None if INVOKES in cell else IDS, cell, namespace, quiet=True, runner=runner)
        model.zero_grad(set_to_none=True)
        return namespace
    run.namespace = {}
    return run


def magic_runner(shell):
    def runner(model):
        shell.user_ns.update(model=model, interrupt_ids=IDS)

        def run(cell):
            shell.run_cell_magic("trace", "model -q" if INVOKES in cell else "model interrupt_ids -q", cell)
            model.zero_grad(set_to_none=True)
            return shell.user_ns
        run.namespace = shell.user_ns
        return run
    return runner


def fresh_model():
    return tiny_gpt2(n_layer=2, seed=5)


def sweep(make_runner, cell) -> list:
    """(k, where, problems) for every k tried whose run left something behind. After such a run the
    sweep goes on with a new model and no stale runtime, so each k is judged on its own."""
    model = fresh_model()
    run = make_runner(model)
    if FULL:
        compiler.compile_cell.cache_clear()
    else:
        run(cell)                                       # compile once, warm the caches
    with Injector(record=True) as counter:              # the line events of a clean run
        run(cell)
    flags = [p.requires_grad for p in model.parameters()]
    failures, planned = [], points(counter.lines, FULL_MODE, STRIDE)
    k, interrupted, log = 0, True, SweepLog(counter.count, len(planned))
    while interrupted and k <= 2 * counter.count:       # the planned k, then on until a run completes
        k = planned.pop(0) if planned else k + (1 if FULL else STRIDE)
        with log.timed(k):
            interrupted, where, found = try_at(model, run, cell, k, flags)
        if found:
            failures.append((k, where, found))
            model, run = repair(run.namespace, make_runner)
    assert not interrupted, f"the cell never completed: {k} line events"
    log.say_if_unusual()
    return failures


class SweepLog:
    """How a sweep went: its tries and their times. A sweep that needed more tries than planned (runs longer than
    the clean one it was planned on) or had a slow try says so in the run's warnings, with what it measured."""

    def __init__(self, events: int, planned: int):
        self.events, self.planned, self.times = events, planned, []

    @contextlib.contextmanager
    def timed(self, k):
        start = time.perf_counter()
        yield
        self.times.append((time.perf_counter() - start, k))

    def say_if_unusual(self):
        extra, slowest = len(self.times) - self.planned, max(self.times)
        if extra > 1 or slowest[0] > 5:
            warnings.warn(f"interrupt sweep: {len(self.times)} tries ({self.planned} planned on a clean run of "
                          f"{self.events} line events), {sum(t for t, _ in self.times):.1f} s in all, slowest "
                          f"{slowest[0]:.2f} s at k={slowest[1]}; torch threads {torch.get_num_threads()}")


def repair(namespace, make_runner):
    """A clean slate after a run that left a mess: a new model, no stale runtime, no stale names."""
    runtime._local.runtimes.clear()
    runtime._tracing.clear()
    for name in [n for n in namespace if n.startswith("__nbgrad") or n in CELL_NAMES]:
        del namespace[name]
    torch.set_grad_enabled(True)
    model = fresh_model()
    return model, make_runner(model)


def try_at(model, run, cell, k, flags) -> tuple:
    """Run the cell with an interrupt at line event k: (was it interrupted, where, problems)."""
    if FULL:
        compiler.compile_cell.cache_clear()
    spy = Spy(model)
    injector = Injector(k)
    found = []
    try:
        with injector:
            run(cell)
    except KeyboardInterrupt:
        pass
    except BaseException as error:          # an interrupt must surface as itself
        found.append(f"{type(error).__name__}: {error}")
    finally:
        spy.remove()
        model.zero_grad(set_to_none=True)
    found += problems_after(model, run.namespace, flags, spy)
    found += next_cell_problems(model, run) if not found else []
    return injector.where is not None, injector.where, found


def report(failures) -> str:
    k, where, found = failures[0]
    return f"{len(failures)} of the tried lines left a mess; first k={k} at {where}: {found}"


@pytest.mark.parametrize("cell", sorted(CELLS))
def test_interrupt_at_every_line_through_the_api(cell):
    if cell not in COMPILED_WITH_NAMES:
        assert compiler.compile_cell(CELLS[cell]).direct == (cell in DIRECT)
    failures = sweep(api_runner, CELLS[cell])
    assert not failures, report(failures)


@pytest.mark.parametrize("cell", DIRECT)
def test_interrupt_at_every_line_of_the_general_runtime_too(cell):
    """The cells that run directly, swept through the general runtime as well: it still runs every other cell."""
    failures = sweep(functools.partial(api_runner, runner="general"), CELLS[cell])
    assert not failures, report(failures)


@pytest.mark.parametrize("cell", sorted(CELLS))
def test_interrupt_at_every_line_through_the_magic(shell, cell):
    failures = sweep(magic_runner(shell), CELLS[cell])
    assert not failures, report(failures)
