"""Cell text -> Program: the AST questions, the rewrite of each statement, the hook graph.

Why a folder: compiling is pure (text in, Program out, no model, no torch state) and cached per cell, so it
can be read and tested apart from running; the runtime only ever sees the Program it hands over."""
