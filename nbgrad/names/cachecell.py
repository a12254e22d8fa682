"""`cache(names="canonical", ...)` in a cell: the call becomes a dict of saved canonical reads
(`{"layers.0.resid_pre": model.transformer.h[0].input.save(), ...}`), on the call's own lines; with `grads=True`
a second dict, of their gradients, is bound beside it on the same line, and after the run both make one
`CanonicalCache` (rewrite.wrap_caches). `device=` / `dtype=` keep detached copies moved / cast, as `cache(...)`
does."""
from __future__ import annotations

import ast

from ..errors import NbgradError
from .cache import cached_names

OPTIONS = ("names", "grads", "device", "dtype")
GRADS_OF = "nbgrad_grads_of_"        # the name the gradients are bound to, beside the cache's own name
VIEW_GRADS_OF = "nbgrad_view_grads_of_"    # the gradients of its views
COPY_OF = "nbgrad_copy_of_"          # and its device= / dtype=, where it has gradients
_NO_GRADS = ("attn.head_out",)       # computed from attn.z for the cache: no gradient of the model flows into it
_VIEWS = ("attn.z",)                 # a view of an event: its gradient is the event's, viewed the same way


def is_canonical_cache(node: ast.AST) -> bool:
    """`cache(..., names="canonical")` or `tracer.cache(..., names="canonical")`."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    named = isinstance(func, ast.Name) and func.id == "cache" or \
        isinstance(func, ast.Attribute) and func.attr == "cache"
    return named and any(k.arg == "names" and isinstance(k.value, ast.Constant) and k.value.value == "canonical"
                         for k in node.keywords)


def _options(call: ast.Call, text_of) -> tuple:
    """(pattern, grads, copy): `copy` is the `.detach().to(...)` each value takes ('' without device or dtype)."""
    pattern = call.args[0].value if call.args and isinstance(call.args[0], ast.Constant) else "*"
    keywords = {k.arg: k.value for k in call.keywords}
    grads = keywords.get("grads", ast.Constant(False))
    if not isinstance(pattern, str) or len(call.args) > 1 or set(keywords) - set(OPTIONS) \
            or not (isinstance(grads, ast.Constant) and isinstance(grads.value, bool)):
        raise NbgradError('cache(names="canonical") takes one pattern of canonical keys ("layers.*.resid_post"), '
                          "grads=True or False, device= and dtype=", call.lineno)
    moved = [f"{name}={text_of(keywords[name])}" for name in ("device", "dtype") if name in keywords]
    return pattern, grads.value, f".detach().to({', '.join(moved)})" if moved else ""


def _grads_text(rewrite, call: ast.Call, name: str, keywords: dict) -> str:
    """`; GRADS = {...}` after the cache's statement: the gradient of each value the cache holds (a view's
    through its event), then its device / dtype where given."""
    root, pattern = sorted(rewrite.roots)[0], _options(call, rewrite.text_of)[0]
    views = [f"{key!r}: {type(rewrite)(f'{root}.{expression}.grad', (root,), rewrite.vocabulary).text}.save()"
             for key, expression in cached_names(rewrite.vocabulary.facts, pattern) if key.endswith(_VIEWS)]
    text = f"; {GRADS_OF}{name} = {{key: value.grad.save() for key, value in {name}.items() " \
           f"if not key.endswith({_NO_GRADS + _VIEWS!r})}}" + \
        (f"; {VIEW_GRADS_OF}{name} = {{{', '.join(views)}}}" if views else "")
    moved = ", ".join(f"{k}={rewrite.text_of(keywords[k])}" for k in ("device", "dtype") if k in keywords)
    return text + (f"; {COPY_OF}{name} = dict({moved})" if moved else "")


def display(rewrite, call: ast.Call) -> str:
    """The call as a dict of saved canonical reads; with device= or dtype= and no grads, each a detached copy
    moved / cast as it arrives (with grads the values stay alive for the backward pass, and are copied after)."""
    pattern, grads, copy = _options(call, rewrite.text_of)
    root, facts = sorted(rewrite.roots)[0], rewrite.vocabulary.facts
    names = cached_names(facts, pattern)
    rewrite.eager |= any(key.endswith(".attn.pattern") for key, _ in names)
    reads = [f"{key!r}: {type(rewrite)(f'{root}.{expression}', (root,), rewrite.vocabulary).text}"
             f"{'' if grads else copy}.save()" for key, expression in names]
    return "{" + ", ".join(reads) + "}"


def grads_statements(rewrite, tree: ast.AST) -> tuple:
    """(offset, offset, text) edits that bind each `grads=True` canonical cache's gradients beside it (and its
    device / dtype, for the copies made after the run), and the caches: name -> whether it has gradients."""
    edits, caches = [], {}
    backward = any(isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                   and node.func.attr == "backward" for node in ast.walk(tree))
    for node in ast.walk(tree):
        call = getattr(node, "value", None) if isinstance(node, (ast.Assign, ast.Expr)) else None
        if not is_canonical_cache(call):
            continue
        bound = isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
        grads, keywords = _options(call, rewrite.text_of)[1], {k.arg: k.value for k in call.keywords}
        if bound:
            caches[node.targets[0].id] = grads
        if not grads:
            continue
        if not bound:
            raise NbgradError('cache(names="canonical", grads=True) is bound to a name: `c = cache(...)`',
                              node.lineno)
        if not backward:
            raise NbgradError('cache(names="canonical", grads=True): the cell runs no backward pass; add '
                              "`loss.backward()` (or `with loss.backward():`), or drop grads=True", node.lineno)
        name, end = node.targets[0].id, rewrite.offset(node.end_lineno, node.end_col_offset)
        edits.append((end, end, _grads_text(rewrite, call, name, keywords)))
    return edits, caches
