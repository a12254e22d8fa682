"""A remote cell's module paths checked on the skeleton before anything is sent: a path that is not in the model is
the error a local run gives ("did you mean"), with no round trip to the actor."""
from __future__ import annotations

import re

from ..engine.compile.compiler import compile_cell
from ..engine.compile.unroll import NeedsElements
from ..errors import diagnose
from ..names import rewrite_of
from .paths import RemotePath

# What finding a module by its path raises when a step of it is not in the model
_PATH_ERRORS = (AttributeError, IndexError, KeyError, TypeError)
# `M.source.NAME` (a site) and `M.skip`: the module path is what stands before them
_AFTER_MODULE = re.compile(r"\.source(?=\.|$).*$|\.skip$")


def check_paths(handle, source: str, namespace: dict) -> None:
    """Raise the local run's ModulePathError for the first plain module path of the cell (canonical names
    rewritten to the model's own) that the skeleton does not hold. A path made of names the cell binds, or that
    a loop walks, is left to the run, as locally."""
    names = on_skeleton(handle, namespace)
    try:
        program = compile_cell(rewrite_of(source, handle.skeleton, names).text, "trace")
    except NeedsElements:        # a loop that makes invokes: unrolled on the actor, which checks its paths
        return
    for target in program.forward_targets:
        if not target.uses or target.needs or target.every_element:
            continue
        try:
            eval(_AFTER_MODULE.sub("", target.text), names)
        except _PATH_ERRORS as error:
            raise diagnose.module_path_error(program.uses[min(target.uses)], names, error) from error
        except Exception:        # a name that is not bound (yet): the run says so on its line
            continue


def on_skeleton(handle, namespace: dict) -> dict:
    """The namespace with the handle as its skeleton and its modules (RemotePath) as the skeleton's."""
    skeleton = handle.skeleton
    return {name: skeleton if value is handle else
            skeleton.get_submodule(value._path) if isinstance(value, RemotePath) and value._handle is handle
            else value for name, value in namespace.items()}
