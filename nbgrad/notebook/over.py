"""`%%trace MODEL --over DATASET [options]`: the options on the line, read and handed to the dataset driver."""
from __future__ import annotations

from IPython.core.magic_arguments import argument

from .. import datasets
from ..engine.checks import DATASET_DEFAULTS
from ..errors import InputError

_OPTIONS = (
    argument("--over", default=None, help="expression: run the cell once per example of DATASET (a list of "
                                          "prompts, any iterable of INPUTs, or a datasets.Dataset)"),
    argument("--batch-size", type=int, default=None, help="examples run at a time with --over (default 8)"),
    argument("--column", default=None, type=str, help="the column of a datasets.Dataset that holds the INPUTs "
                                            "(default: text)"),
    argument("--out", default=None, type=str, help="folder: write each batch's saved values there (safetensors); "
                                         "running the cell again computes only the missing batches"),
    argument("--engine", default=None, choices=["local", "ray"], help="where the batches run (default local)"),
    argument("--workers", type=int, default=None, help="Ray actors, each holding a model (default: one per "
                                                       "GPU of the cluster, else 2)"),
    argument("--model-factory", default=None, help="expression: a function that returns the model, for "
                                                   "Ray workers (default: nbgrad.load_model's own arguments)"),
)


def dataset_options(args) -> dict:
    """The dataset options given on a line (None: not given), by nbgrad.trace's keyword."""
    return {"batch_size": args.batch_size, "column": args.column, "out": args.out, "engine": args.engine,
            "workers": args.workers, "model_factory": args.model_factory}


def over_arguments(magic):
    """The --over options, added to a magic's `magic_arguments` (applied innermost first)."""
    for option in reversed(_OPTIONS):
        magic = option(magic)
    return magic


def trace_over_line(magics, model, model_name: str, input_text, args, cell: str, tokenizer) -> None:
    """Run the cell over the dataset; the saved names become lists in the notebook, and a line says so."""
    if input_text is not None:
        raise InputError(f"INPUT `{input_text}` and --over together: with --over each example is an INPUT; "
                         f"write `%%trace {model_name} --over DATASET`")
    dataset = magics._evaluate(args.over, "--over")
    factory = magics._evaluate(args.model_factory, "--model-factory") if args.model_factory else None
    out = args.out.strip("'\"") if args.out else None
    batch_size = DATASET_DEFAULTS["batch_size"] if args.batch_size is None else args.batch_size
    result = datasets.trace(model, None, cell, magics.shell.user_ns, over=dataset, batch_size=batch_size,
                            out=out, engine=args.engine or DATASET_DEFAULTS["engine"], workers=args.workers,
                            column=args.column.strip("'\"") if args.column else None,
                            model_factory=factory, no_grad=args.no_grad, tokenizer=tokenizer)
    if not args.quiet and result.saved:
        names = ", ".join(f"{name} ({len(values)} values)" for name, values in result.saved.items())
        print(f"nbgrad: saved, one value per example: {names}" + (f"; in {out}" if out else ""))
        _display(result.saved, f"%%trace {model_name} --over {args.over}", tokenizer, cell, model)


def _display(saved: dict, title: str, tokenizer, cell: str = "", model=None) -> None:
    """The values as a panel, examples stacked (views/dataset.py); a Cache name shows its first example's cache."""
    from IPython.display import display
    from ..engine.results.cache import Cache
    from ..views.cache import CachePanel
    from ..views.dataset import dataset_panel
    caches = [name for name, values in saved.items() if len(values) and isinstance(values[0], Cache)]
    panel = dataset_panel(saved, title, tokenizer, skip=caches, cell=cell)
    from .provenance import footed
    if panel is not None:
        display(footed(panel, model, title))
    for name in caches:
        display(footed(CachePanel(saved[name][0].summary(), title=f"{name}[0], the first example's "
                                  f"(of {len(saved[name])})"), model, title))
