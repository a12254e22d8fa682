"""Program + model -> Result: hooks on the events the graph names, statements run when those fire.

Why a folder: this is the code that touches a live model, so it owns every hook handle and every piece of
state it changes, and gives all of it back in one `finally` (errors and interrupts included)."""
