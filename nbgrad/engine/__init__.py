"""The engine: `compile/` turns a cell into a Program (its hook graph), `run/` runs a Program on a model.

Why a folder: everything else in nbgrad is a driver or a picture of what happens here, so the engine must
be readable on its own and testable against plain PyTorch hooks. It imports nothing of nbgrad but `errors`;
drivers (trace, generate, datasets) and pictures sit above it and it never learns of them."""
