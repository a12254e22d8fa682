"""A remote cell's module paths checked on the skeleton before anything is sent: a path that is not in the model is
the error a local run gives ("did you mean"), a site that the module's forward does not have the local run's
SiteNameError, a `cache(...)` that matches no module its ModulePathError (remote/cachecheck.py), and a
misspelled event (`.outptu`, `.skp(...)`) the local run's AttributeError with its note
(remote/spelling.py), with no round trip to the actor."""
from __future__ import annotations

from ..engine.compile.compiler import compile_cell
from ..engine.compile.program import RUNTIME_NAME
from ..engine.compile.unroll import NeedsElements
from ..engine.run.forward import PATH_ERRORS
from ..engine.run.runtime import Runtime
from ..engine.run.sites import NoSourceError, SiteError
from ..errors import diagnose
from ..names import rewrite_of
from .paths import RemotePath
from .cachecheck import check_caches
from .spelling import check_event_names


def check_paths(handle, source: str, namespace: dict, autograd: bool = True) -> None:
    """Raise what the local run raises for the first plain module path of the cell (canonical names rewritten to
    the model's own) that the skeleton does not hold, or for a site its module's forward does not have; then for
    a misspelled event of a module. A path made of names the cell binds, or that a loop walks, is left to the
    run, as locally. `autograd`: whether the cell runs with autograd on (not --no-grad, not a generation)."""
    names = on_skeleton(handle, namespace)
    text = rewrite_of(source, handle.skeleton, names).text
    try:
        program = compile_cell(text, "trace")
    except NeedsElements:        # a loop that makes invokes: unrolled on the actor, which checks its paths
        return
    opened = {**names, RUNTIME_NAME: Runtime}         # `M.source.SITE` and `M.skip` open on the skeleton, as locally
    for target in program.forward_targets:
        if not target.uses or target.needs or target.every_element:
            continue
        use = program.uses[min(target.uses)]
        try:
            eval(target.code, opened)
        except (SiteError, NoSourceError) as error:          # the local run's own message, at the use's line
            raise type(error)(error.detail, error.line or use.line) from None
        except PATH_ERRORS as error:
            raise diagnose.module_path_error(use, names, error) from error
        except Exception:        # a name that is not bound (yet): the run says so on its line
            continue
    check_caches(text, names, handle.skeleton, autograd and bool(program.graph.passes))
    check_event_names(text, names, program.filename, handle.skeleton)


def on_skeleton(handle, namespace: dict) -> dict:
    """The namespace with the handle as its skeleton and its modules (RemotePath) as the skeleton's."""
    skeleton = handle.skeleton
    return {name: skeleton if value is handle else
            skeleton.get_submodule(value._path) if isinstance(value, RemotePath) and value._handle is handle
            else value for name, value in namespace.items()}
