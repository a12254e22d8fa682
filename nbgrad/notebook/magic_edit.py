"""`%%edit MODEL`: install the cell's writes and edits on MODEL for every later call (`nbgrad.edit`)."""
from __future__ import annotations

import keyword

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, magics_class, no_var_expand
from IPython.core.magic_arguments import argument, kwds, magic_arguments
from torch import nn

from .. import api
from ..errors import NbgradError, for_the_cell
from ..errors.naming import a_or_an
from .magic_line import split_line


@magics_class
class EditMagics(Magics):

    @magic_arguments()
    @kwds(usage="%%edit MODEL [--out NAME]")
    @argument("model", help="name of a torch.nn.Module in the notebook's namespace")
    @argument("--out", default=None, type=str, help="bind the Edit to NAME (NAME.remove() takes it off)")
    @no_var_expand
    @cell_magic
    def edit(self, line: str, cell: str):
        """Install the cell's writes and in-place edits (a body like %%trace's, with no INPUT) on MODEL for every
        later call of it: a plain call, `generate`, later %%trace and %%generate cells. Returns the Edit;
        `.remove()` takes it off. Reads and saves belong in a %%trace cell."""
        __tracebackhide__ = True
        head, _, rest = line.strip().partition(" ")
        if not head or head.startswith("-"):
            raise UsageError("usage: %%edit MODEL [--out NAME]; see %%edit?")
        extra, args = split_line(rest, self.edit, [head])
        if extra:
            raise UsageError(f"%%edit MODEL takes no INPUT: `{extra}` follows MODEL, and an edit applies to every later "
                             f"call of the model, whatever its input (see %%edit?)")
        if args.out is not None and (not args.out.isidentifier() or keyword.iskeyword(args.out)):
            raise UsageError(f"--out takes a name to bind the Edit to, not `{args.out}`")
        if not cell.strip():
            raise UsageError("%%edit MODEL needs a body: the writes and edits to install, e.g. "
                             "`model.transformer.h[0].output[:, -1] = 0`")
        installed = None
        try:
            installed = api.edit(self._model(args.model), cell, self.shell.user_ns,
                                 label=f"%%edit {line.strip()}")
            if args.out is not None:
                self.shell.user_ns[args.out] = installed
            return installed
        except BaseException as error:    # an interrupt before the cell hands the Edit back: it installs and binds
            if installed is not None:     # nothing (one landing between the install and the next line too)
                api.withdraw(installed)
                if args.out is not None and self.shell.user_ns.get(args.out) is installed:
                    del self.shell.user_ns[args.out]
            raise for_the_cell(error)

    def _model(self, name: str) -> nn.Module:
        if not name.isidentifier() or keyword.iskeyword(name) or name not in self.shell.user_ns:
            raise NbgradError(f"unknown model '{name}': MODEL is the name of a module in the notebook, such as "
                              f"`model` after `model = nbgrad.load_model()`")
        model = self.shell.user_ns[name]
        if not isinstance(model, nn.Module):
            raise NbgradError(f"'{name}' is {a_or_an(type(model).__name__)}, not a torch.nn.Module")
        return model
