"""What to say of a site (`M.source.NAME`, `SITE.source.NAME`) that a cell names and the forward cannot give: a name
it has no site of, an assignment opened as a call, a call of a module. The run raises them (engine/run/sites.py)."""
from __future__ import annotations

import difflib


def nearest(name: str, names) -> str:
    close = difflib.get_close_matches(name, list(names), n=6, cutoff=0.5)
    return ", ".join(close or list(names)[:12]) or "(none)"


def no_site(label: str, name: str, names) -> str:
    """A name M's forward has no site of; a softmax asked of an attention module is in the function it calls."""
    calls = [site for site in names if site.startswith("attention_interface")]
    pattern = "" if "softmax" not in name or not calls else (
        f". The attention pattern is computed in the function {calls[-1]} calls: "
        f"{calls[-1]}.source.nn_functional_softmax_0 (with attn_implementation=\"eager\")")
    return f"{label} has no site {name!r}; nearest: {nearest(name, names)}. `%source` lists them all{pattern}"


def callee_has_no_site(label: str, name: str, names, site: str, called: str) -> str:
    """A name the function a call site called in this run has no site of. A fused attention function (sdpa, flash)
    has no softmax of its own: the pattern is in the eager one."""
    fused = "" if "sdpa" not in called and "flash" not in called else (
        ": a fused attention function computes the pattern inside one kernel, so it has no site for it; load the "
        "model with nbgrad.load_model(..., attn_implementation=\"eager\") to reach it")
    return f"{label} has no site {name!r}; nearest: {nearest(name, names)}. {site} called {called} in this run{fused}"


def not_a_call(label: str, site: str, names) -> str:
    """`SITE.source` of an assignment site, with the sites of the same name (its other assignments and calls)."""
    siblings = [name for name in names if name.rsplit("_", 1)[0] == site.rsplit("_", 1)[0] and name != site]
    same = f". Sites of the same name: {', '.join(siblings)}" if siblings else ""
    return f"{label}: {site} is an assignment, not a call, so it has no `.source` (a call site's opens the function " \
           f"it calls){same}"


def calls_a_module(label: str, site: str, module: str) -> str:
    return f"{label}: {site} calls a module ({module}); use that module's own `.source`"
