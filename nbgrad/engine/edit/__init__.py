"""Persistent edits (`%%edit`, `nbgrad.edit`): a cell's edits kept on a model across its calls. Each call of the model
under an edit is one run of the run core (engine/run/), as each forward call of `generate` is one step of a run.

Why a folder: an edit outlives the cell that made it, so it owns what it leaves on a model between calls (its hooks,
its stack of edits on each model, what a gradient edit holds until its backward pass) and gives it back at
`.remove()`."""
