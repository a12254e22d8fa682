"""`%%backward LOSS` of a value a remote cell bound: the actor holds the original, with its autograd graph
(kept.py), so the pass runs there, with the body's names sent as a cell's are; what the body bound and saved
comes back as from a cell. The parameters' `.grad` stay on the actor (they are as large as the weights):
`handle.<path>.grad` reads one."""
from __future__ import annotations

from ..engine.compile.compiler import compile_cell
from ..engine.results.result import Result
from ..errors import NbgradError
from .exchange import exchange
from .kept import mark
from .paths import Kept
from .shipping import picklable, shipped_names

RESTARTED = ("LOSS came back from a cell of {name} on an actor that has since been restarted, and its autograd graph "
             "went with that actor: run that cell again, then %%backward its loss")


def run_backward(where, source: str, namespace, *, grad_output=None, retain_graph: bool = False,
                 create_graph: bool = False) -> Result:
    """`nbgrad.backward(copy, source, namespace, ...)` where `where` (a KeptOn) says which actor holds the
    original: a Result as the local pass gives, but for the parameters' leaf gradients."""
    handle = where.handle
    if not where.live():
        raise NbgradError(RESTARTED.format(name=handle._label))
    program = compile_cell(source, "backward")
    namespace = namespace if namespace is not None else {}
    shipped = shipped_names(source, namespace, handle)
    picklable("--grad-output", grad_output)
    answer = exchange(handle, "backward", source, shipped, Kept(where.number),
                      {"grad_output": grad_output, "retain_graph": retain_graph, "create_graph": create_graph})
    namespace.update(answer["bound"])
    mark(handle, answer["kept"])
    leaves = answer["leaf_grads"]
    return Result(saved=answer["saved"], graph=program.graph, leaf_grads=leaves, grad_pairs=answer["grad_pairs"],
                  accumulated={name for name in answer["accumulated"] if name in leaves})
