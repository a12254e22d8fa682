"""`%source M`: print the source of M's forward with each site's name beside its line. `%names MODEL`: each
canonical name beside its real path for that model."""
from __future__ import annotations

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from torch import nn

from ..api import source as listing
from ..errors.naming import a_or_an
from ..models.skeleton import on_skeleton
from ..names import listing as names_listing, part_listing
from ..names.detect import family_of
from .magic_line import OPTION, evaluate, words


@magics_class
class SourceMagics(Magics):

    @line_magic
    def source(self, line: str):
        """%source MODULE: the forward of MODULE (any module expression) with every site's name, as
        `MODULE.source.NAME` takes it in a %%trace cell."""
        expression = line.strip()
        if not expression:
            raise UsageError("%source MODULE: give a module (model.transformer.h[0].attn) or a function")
        _no_options(expression, "%source MODULE")
        owner, is_site, _ = expression.partition(".source.")
        if is_site:         # `M.source.SITE` exists in a %%trace cell's code only: outside, M has no `.source`
            raise UsageError(f"`{expression}` is a site, and `.source` exists only inside a %%trace cell. "
                             f"`%source {owner}` lists the sites of its forward; the function a call site calls "
                             f"is known only while the model runs: give that function to %source")
        print(listing(evaluate(expression, self.shell.user_ns, "MODULE")))

    @line_magic
    def names(self, line: str):
        """%names MODEL: every canonical name (model.layers[i].resid_mid, ...) beside its path in MODEL; %names of a
        part of a model (model.transformer.h[0]): the model's canonical names that lie in that part."""
        expression = line.strip()
        if not expression:
            raise UsageError("%names MODEL: give a model of a known family (nbgrad.names.FAMILIES)")
        _no_options(expression, "%names MODEL")
        model = evaluate(expression, self.shell.user_ns, "MODEL")
        if not isinstance(model, nn.Module) and not hasattr(model, "skeleton"):
            raise UsageError(f"%names MODEL: `{expression}` is {a_or_an(type(model).__name__)}, not a model: give a "
                             f"torch.nn.Module of a known family (nbgrad.names.FAMILIES)")
        if expression.isidentifier() and family_of(on_skeleton(model)) is not None:
            print(names_listing(on_skeleton(model), expression))
        else:           # a part of a model (`model.transformer.h[0]`): the names of the model that lie in it
            namespace = {name: on_skeleton(value) for name, value in self.shell.user_ns.items()
                         if isinstance(value, nn.Module) or hasattr(value, "skeleton")}
            print(part_listing(on_skeleton(model), expression, namespace))


def _no_options(expression: str, usage: str) -> None:
    """`%names model --bogus`: an option, where the line is one expression (not read as `model - -bogus`)."""
    for start, end in words(expression):
        if OPTION.fullmatch(expression[start:end]):
            raise UsageError(f"{usage} takes no options, but `{expression[start:end]}` is one: give the expression "
                             f"alone")
