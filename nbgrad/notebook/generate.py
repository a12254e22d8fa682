"""`%%generate MODEL INPUT [options]` and its line form `%generate`: the line, read and handed to
`nbgrad.generate`; the panel of the generation. A `%%generate` cell with no body is the line form."""
from __future__ import annotations

import re

from IPython.core.error import UsageError

_CELL_LINE = re.compile(r"%%generate(\s.*)?$", re.DOTALL)


def generate_line(magics, line: str, cell: str, magic, cell_form: bool) -> None:
    """Parse the line of `%%generate` / `%generate` (MODEL, a Python INPUT, options), run the generation with
    `cell` as its body (empty: a plain generation) and show the panel."""
    __tracebackhide__ = True
    from . import comm
    from .. import generation
    from .graph import show_graph
    from .magic_line import split_expression
    title = f"{'%%' if cell_form else '%'}generate {line.strip()}"
    head, _, rest = line.strip().partition(" ")
    if not head or head.startswith("-"):
        raise UsageError(f"usage: {'%%' if cell_form else '%'}generate MODEL INPUT [options]; see %%generate?")
    input_text, args = split_expression(rest, magic, head)
    model, namespace = magics._model(head), magics.shell.user_ns
    if args.graph:
        return show_graph(generation.generate(model, None, cell, namespace, graph=True).graph, title)
    if args.out is not None and not args.out.isidentifier():
        raise UsageError(f"--out takes a name to bind the token ids to; `{args.out}` is not one")
    tokenizer = magics._evaluate(args.tokenizer, "--tokenizer") if args.tokenizer else None
    kwargs = magics._evaluate(args.kwargs, "--kwargs") if args.kwargs else None
    if isinstance(kwargs, str):           # quoted: `--kwargs '{"use_cache": False}'`
        kwargs = magics._evaluate(kwargs, "--kwargs")
    value = magics._evaluate(input_text, "INPUT") if input_text is not None else None
    result = generation.generate(model, value, cell, namespace, args.max_new_tokens, sample=args.sample,
                                 out=args.out, kwargs=kwargs, tokenizer=tokenizer)
    comm.after_cell(magics.shell, model, result)
    if not args.quiet:
        from IPython.display import display
        from ..models import tokenizer_for
        from ..views.generation import generation_panel
        from .provenance import footed
        display(footed(generation_panel(result.input_ids, result.output, result.top_next, result.saved,
                                        tokenizer or tokenizer_for(model), title), model, title))
    return None


def empty_body_as_line(lines: list) -> list:
    """An input transform (IPython's cleanup stage, before cell magics are read): a `%%generate` cell whose body
    is empty or blank is the line magic `%generate` with the same line. IPython refuses an empty cell-magic body
    itself, before any magic runs."""
    if not lines or not lines[0].startswith("%%generate") or any(line.strip() for line in lines[1:]):
        return lines
    match = _CELL_LINE.match(lines[0].rstrip("\n"))
    return [f"%generate{match.group(1) or ''}\n"] if match else lines
