"""The kernel side of the sidebar (filled in with the extension)."""


def register(ipython) -> None:
    return None


def after_cell(shell, model, result) -> None:
    return None
