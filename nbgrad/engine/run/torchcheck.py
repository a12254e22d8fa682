"""HookSet puts hooks straight into torch's private hook dicts (a module's `_forward_hooks`, a tensor's
`_backward_hooks` handed to its grad_fn), which is what makes them cheap. Those dicts are no public API, so the
installed torch is checked once, at import, by using them as HookSet does: a torch that no longer calls them fails
here with a message that names the supported range, never later with hooks that silently do not fire."""
from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

SUPPORTED_TORCH = ">=2.1,<3"      # the range pyproject.toml states


def private_hooks_problem(module_type=nn.Identity) -> str | None:
    """None when a hook put into the private dicts fires as torch's own would; else what went wrong."""
    seen = []
    try:
        module = module_type()
        module._forward_hooks[-1] = lambda mod, args, output: seen.append("forward")
        output = module(torch.ones(1, requires_grad=True)) * 2
        hooks = output._backward_hooks = OrderedDict()
        output.grad_fn._register_hook_dict(output)
        hooks[-1] = lambda grad: seen.append("gradient")
        output.sum().backward()
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    missing = [event for event in ("forward", "gradient") if event not in seen]
    return f"a {' and a '.join(missing)} hook put into torch's hook dict did not fire" if missing else None


def require_private_hooks(module_type=nn.Identity) -> None:
    problem = private_hooks_problem(module_type)
    if problem is not None:
        raise ImportError(f"nbgrad needs torch{SUPPORTED_TORCH}; the installed torch {torch.__version__} does not "
                          f"run hooks the way nbgrad registers them ({problem}). Install a torch in that range.")
