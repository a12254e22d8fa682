"""Cell text -> Program: the AST questions, the rewrite of each statement, the hook graph."""
