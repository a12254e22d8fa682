"""Pasted nnsight code: in a cell body, `tracer` (unless the notebook or the cell binds it) is nbgrad's own
name for nnsight's tracer forms. The body's text is rewritten before it is compiled, in place on each line
(no line is added or removed, so errors keep their cell lines):

    tracer.cache(...)            -> cache(...)
    tracer.stop()                -> stop()
    with tracer.invoke(INPUT):   -> with invoke(INPUT):
    with tracer.iter[a:b]:       -> if step in range(STEPS)[a:b]:        (%%generate; STEPS = max new tokens)
    with tracer.iter[i]:         -> if step in (range(STEPS)[i],):
    for i in tracer.iter[a:b]:   -> for i in ([step] if step in range(STEPS)[a:b] else []):
    with tracer.all():           -> if True:                             (%%generate: the body runs every step)

Any other use of `tracer` is an error that names nbgrad's way."""
from __future__ import annotations

import ast

from ...errors import NbgradError

NAME = "tracer"
_HINTS = {
    "log": "print(...) prints from the body as it runs",
    "barrier": "nbgrad needs no barrier: each statement runs when what it reads exists, in any order",
    "result": "the model's output is `model.output`",
    "output": "the model's output is `model.output`",
    "next": "in %%generate the body runs at every step; select steps with `if step ...`",
    "apply": "call the function in the body yourself",
}
_FORMS = ("nbgrad's forms: `cache(...)`, `stop()`, `with invoke(INPUT):`, and in %%generate "
          "`with tracer.iter[a:b]:` / `with tracer.all():` (or `if step ...`)")


def rewritten(source: str, namespace: dict | None, steps: int | None = None) -> str:
    """`source` with nnsight's tracer forms said nbgrad's way; unchanged when it does not name `tracer`, or the
    notebook or the cell binds that name. `steps`: the new tokens of a %%generate (None in %%trace)."""
    if NAME not in source or (namespace is not None and NAME in namespace):
        return source
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source          # the compiler reports it
    if _binds_tracer(tree):
        return source
    lines = source.splitlines(keepends=True)
    edits = _edits(tree, lines, steps)
    for line, start, stop, text in sorted(edits, reverse=True):
        encoded = lines[line - 1].encode()
        lines[line - 1] = (encoded[:start] + text.encode() + encoded[stop:]).decode()
    return "".join(lines)


def _binds_tracer(tree) -> bool:
    return any(isinstance(node, ast.Name) and node.id == NAME and not isinstance(node.ctx, ast.Load)
               for node in ast.walk(tree)) or any(
        isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and NAME in
        [a.arg for a in node.args.args + node.args.kwonlyargs + node.args.posonlyargs] for node in ast.walk(tree))


def _edits(tree, lines: list, steps: int | None) -> list:
    """(line, start byte, stop byte, new text) for every use of `tracer`; an unknown use is an error."""
    edits, handled = [], set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.With, ast.For)):
            edit = _header(node, lines, steps)
            if edit is not None:
                edits.append(edit[0])
                handled.add(id(edit[1]))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_tracer(node.value) and id(node.value) not in handled:
            if node.attr in ("cache", "stop", "invoke"):
                name = node.value
                edits.append((name.lineno, name.col_offset, node.end_col_offset - len(node.attr), ""))
                handled.add(id(name))
            else:
                raise _unknown(node.attr, node.lineno, steps)
    for node in ast.walk(tree):
        if _is_tracer(node) and id(node) not in handled:
            raise NbgradError(f"`{NAME}` on its own is nnsight's tracer object; nbgrad has none to pass around. "
                              f"{_FORMS}", node.lineno)
    return edits


def _header(node, lines: list, steps: int | None):
    """The edit of a `with tracer.iter[...]:` / `with tracer.all():` / `for i in tracer.iter[...]:` header, and
    the `tracer` name it consumes; None for any other header."""
    if isinstance(node, ast.With):
        if len(node.items) != 1 or node.items[0].optional_vars is not None:
            return None
        selector = _selector(node.items[0].context_expr)
    else:
        selector = _selector(node.iter)
    if selector is None:
        return None
    name, steps_text = selector
    if steps is None:
        raise NbgradError(f"`{NAME}.iter` / `{NAME}.all()` select generation steps: they belong in a %%generate "
                          f"cell (in %%trace the model runs once)", node.lineno)
    if _header_lines(node) > 1:
        raise NbgradError(f"write `{NAME}.iter[...]` / `{NAME}.all()` on one line", node.lineno)
    condition = f"step in {_step_set(steps_text, steps, lines)}"
    end = node.body[0]
    header_end = (_colon_before(lines, end) if end.lineno == node.lineno
                  else len(lines[node.lineno - 1].rstrip("\r\n").encode()))
    if isinstance(node, ast.With):
        text = f"if {condition}:"
    else:
        target = ast.get_source_segment("".join(lines), node.target)
        text = f"for {target} in ([step] if {condition} else []):"
    return (node.lineno, node.col_offset, header_end, text), name


def _selector(expression):
    """(the `tracer` name, the step selection as source text or None for all steps) of `tracer.iter[...]` or
    `tracer.all()`; None for anything else."""
    if (isinstance(expression, ast.Subscript) and isinstance(expression.value, ast.Attribute)
            and expression.value.attr == "iter" and _is_tracer(expression.value.value)):
        return expression.value.value, expression.slice
    if (isinstance(expression, ast.Call) and isinstance(expression.func, ast.Attribute)
            and expression.func.attr == "all" and _is_tracer(expression.func.value)
            and not expression.args and not expression.keywords):
        return expression.func.value, None
    return None


def _step_set(selection, steps: int, lines: list) -> str:
    if selection is None:
        return f"range({steps})"
    text = ast.get_source_segment("".join(lines), selection)
    if isinstance(selection, ast.Slice):
        return f"range({steps})[{text}]"
    return f"(range({steps})[{text}],)"


def _colon_before(lines: list, body_start) -> int:
    """The byte just after the header's `:` on a one-line `with ...: body` / `for ...: body`."""
    encoded = lines[body_start.lineno - 1].encode()
    return encoded.rindex(b":", 0, body_start.col_offset) + 1


def _header_lines(node) -> int:
    item = node.items[0].context_expr if isinstance(node, ast.With) else node.iter
    return item.end_lineno - node.lineno + 1


def _is_tracer(node) -> bool:
    return isinstance(node, ast.Name) and node.id == NAME


def _unknown(attribute: str, line: int, steps: int | None) -> NbgradError:
    hint = _HINTS.get(attribute)
    if attribute in ("iter", "all"):
        hint = ("select steps with `with tracer.iter[a:b]:`, `for i in tracer.iter[a:b]:` or `with tracer.all():`"
                if steps is not None else "they select generation steps: use them in a %%generate cell")
    return NbgradError(f"`{NAME}.{attribute}` is nnsight's; nbgrad has no such form"
                       f"{': ' + hint if hint else ''}. {_FORMS}", line)
