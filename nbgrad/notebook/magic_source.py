"""`%source M`: print the source of M's forward with each site's name beside its line."""
from __future__ import annotations

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class

from ..engine.run.listing import listing


@magics_class
class SourceMagics(Magics):

    @line_magic
    def source(self, line: str):
        """%source MODULE: the forward of MODULE (any module expression) with every site's name, as
        `MODULE.source.NAME` takes it in a %%trace cell."""
        expression = line.strip()
        if not expression:
            raise UsageError("%source MODULE: give a module (model.transformer.h[0].attn) or a function")
        target = eval(expression, self.shell.user_ns)
        print(listing(target))
