import os
import warnings
from pathlib import Path

# Every Ray cluster of the tests, and every process that connects to one, authenticates with Ray's token
# (~/.ray/auth_token): a driver that connects to a given address does so only when told, and Ray reads this once
os.environ.setdefault("RAY_AUTH_MODE", "token")

import pytest  # noqa: E402
import torch  # noqa: E402

import nbgrad  # noqa: E402
from helpers import tiny_gpt2  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
torch.manual_seed(0)
# The tests run tiny models: one thread is fastest, and on a busy machine (CI, or a second `make test`
# beside this one) more threads than free cores spin against each other and slow every test many-fold.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def one_torch_thread(request):
    """A test that leaves torch on more threads slows every later test of its worker many-fold on a busy machine:
    put it back, and say which test it was."""
    yield
    if torch.get_num_threads() != 1:
        warnings.warn(f"{request.node.nodeid} left torch on {torch.get_num_threads()} threads")
        torch.set_num_threads(1)


@pytest.fixture(scope="session")
def default_model():
    return nbgrad.load_model()


@pytest.fixture
def tiny():
    return tiny_gpt2()


@pytest.fixture
def ids():
    return torch.tensor([[3, 14, 15, 92, 65, 35]])


@pytest.fixture(scope="session")
def shell():
    from IPython.core.interactiveshell import InteractiveShell
    ip = InteractiveShell.instance()
    ip.extension_manager.load_extension("nbgrad")
    ip.run_cell("import torch\nimport nbgrad")
    return ip


# `make test` runs the tests on two workers (pytest-xdist, `--dist loadgroup`). Tests that share
# something outside their own temporary directory run on one worker, one after the other, as they would alone:
# - "lab": the browser tests, which share a JupyterLab server (a session fixture: one per worker), and the
#   headless run of a tutorial that writes to a fixed folder, as its run in the browser does (test_notebooks.py);
# - "ray": a local Ray cluster per module, whose processes and session folder a second cluster would contend for.
RAY_MODULES = ("test_datasets_ray.py", "test_remote.py", "test_remote_client.py")


@pytest.fixture(scope="session")
def ray_head():
    """One Ray head node for the Ray modules (nbgrad/datasets/head.py: it starts on a busy machine too), with a
    client server on 127.0.0.1; each module connects and disconnects, and the head ends with the session, or
    with its failed start, taking every process it started along."""
    pytest.importorskip("ray")
    from nbgrad.datasets.head import Head
    tests = Path(__file__).resolve().parent
    # Workers import nbgrad as this process does: the working tree first. One thread each
    head = Head(num_cpus=2, resources={"remote_slot": 2}, client=True,
                env={"PYTHONPATH": f"{tests.parent}:{tests}", "OMP_NUM_THREADS": "1"})
    try:
        yield head
    finally:
        head.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test on the Ray head shows the head's client-server logs: the server's side of a broken connection,
    which the test's own output does not hold and which goes with the head's folder as the session ends. Each log's
    INFO lines (which clients connected when, which servers started and ended: tracebacks can fill its last lines) and
    its last lines."""
    report = (yield).get_result()
    head = getattr(item, "funcargs", {}).get("ray_head")
    if report.failed and head is not None:
        for log in sorted(Path(head.folder).glob("session_latest/logs/ray_client_server*")):
            lines = log.read_text(errors="replace").splitlines()
            events = [line for line in lines if "\tINFO " in line]
            for title, shown in (("INFO lines", events), ("last lines", lines)):
                if shown:
                    report.sections.append((f"Ray head: {log.name}, {title}", "\n".join(shown[-HEAD_LOG_LINES:])))


HEAD_LOG_LINES = 40


def pytest_collection_modifyitems(config, items):
    for item in items:
        group = "lab" if item.path.parent.name == "browser" else "ray" if item.path.name in RAY_MODULES \
            else None
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
