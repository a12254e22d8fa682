"""The engine: `compile/` turns a cell into a Program (its hook graph), `run/` runs a Program on a model.
It imports nothing of nbgrad but `errors`."""
