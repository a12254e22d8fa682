"""The notebook side: IPython magics, the magic line, `%nbgrad`, `%attribute`, the sidebar's comm.

Why a folder: it is the only room that imports IPython, so everything below it works from a script and is
tested without a kernel; a magic here is a thin adapter that reads its line and calls the public API."""
