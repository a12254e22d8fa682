"""Bad arguments to `cache(...)` are one message naming the argument and what cache takes, at the cell's line,
never Python's message about nbgrad's own function; the cell binds nothing and the model is clean."""
import pytest

import nbgrad
from helpers import assert_clean, model_state

TAKES = "cache(modules, *, inputs=..., grads=..., device=..., dtype=...)"


@pytest.mark.parametrize("arguments, message", [
    ("'transformer.h.*', True", f"{TAKES} takes one argument by position, the modules (a glob, a module path, a "
                                f"module or a list of them); give the others by name"),
    ("everything=True", f"cache(...) has no option 'everything': it takes {TAKES}"),
    ("'transformer.h.*', modules='lm_head'", "cache(...) was given modules twice, by position and by name"),
    ("grads='yes'", "cache(grads=...) is True or False, not 'yes'"),
    ("inputs=3", "cache(inputs=...) is True or False, not 3"),
    ("5", "cache(modules=...) takes a glob, a module path, a module or a list of them, not an int"),
])
def test_bad_arguments_to_cache_say_what_it_takes(default_model, arguments, message):
    before = model_state(default_model)
    namespace = {"model": default_model}
    with pytest.raises(nbgrad.NbgradError) as caught:
        nbgrad.trace(default_model, "Hello there", f"x = 1\nc = cache({arguments})\n", namespace)
    assert str(caught.value) == f"line 2: {message}"
    assert "c" not in namespace and "x" not in namespace
    assert_clean(default_model, before)
