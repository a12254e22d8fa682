"""An example's error in an `--over` run is shown at the cell's own line, whichever example of its batch raised
it: the batch's program repeats the cell once per example, and its lines are not the cell's. (The Ray engine's
twin is in test_datasets_ray.py.)"""
import traceback

import pytest

import nbgrad
from helpers import assert_clean, model_state

PROMPTS = ["The Eiffel Tower is in", "Hi", "A longer prompt", "Paris"]
# the second example to run raises: example 1, the second of the first batch
SECOND_RAISES = ("last = model.transformer.h[1].output[:, -1].save()\nseen.append(last)\n"
                 "check(seen)\n")


def check(seen):
    if len(seen) == 2:
        raise ValueError("bad")


def raised_by_second(model, **options):
    namespace = {"model": model, "seen": [], "check": check}
    with pytest.raises(ValueError) as raised:
        nbgrad.trace(model, None, SECOND_RAISES, namespace, over=PROMPTS, batch_size=2, **options)
    assert sorted(namespace) == ["check", "model", "seen"]
    return raised.value


def frames_from_the_cell(error):
    """The traceback's frames from the cell's on: the cell's, then what it called."""
    frames = traceback.extract_tb(error.__traceback__)
    first = next(k for k, f in enumerate(frames) if f.filename.startswith("<nbgrad-cell-"))
    return frames[first:]


def test_an_error_of_the_second_example_of_a_batch_is_at_the_cells_line(default_model):
    before = model_state(default_model)
    error = raised_by_second(default_model)
    assert error.__notes__ == ["nbgrad: raised by example 1 (INPUT 'Hi'), at line 3 of the cell"]
    cell, *below = frames_from_the_cell(error)
    assert (cell.lineno, cell.line) == (3, "check(seen)")
    assert [f.name for f in below] == ["check"]                 # what the cell called is kept below it
    assert not any(f.filename.startswith("<nbgrad-cell-") for f in below)
    assert_clean(default_model, before)
