"""`%source M`: print the source of M's forward with each site's name beside its line."""
from __future__ import annotations

from IPython.core.magic import Magics, line_magic, magics_class

from ..engine.run.listing import listing


@magics_class
class SourceMagics(Magics):

    @line_magic
    def source(self, line: str):
        """%source MODULE: the forward of MODULE (any module expression) with every site's name, as
        `MODULE.source.NAME` takes it in a %%trace cell."""
        target = eval(line.strip(), self.shell.user_ns)
        print(listing(target))
