"""JupyterLab started by the test on localhost, driven by Playwright in the system Chromium."""
import pytest

from labtools import CHROMIUM, CHROMIUM_ARGS, Lab, require_browser


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.parent.name == "browser":
            item.add_marker(pytest.mark.browser)


@pytest.fixture(scope="session")
def browser():
    require_browser()
    from playwright.sync_api import sync_playwright
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="session")
def lab_root(tmp_path_factory):
    return tmp_path_factory.mktemp("lab")


@pytest.fixture(scope="session")
def lab_server(lab_root, browser):
    server = Lab(lab_root)
    yield server
    server.stop()


@pytest.fixture
def lab(lab_server):
    """The session's server; the kernels a test started end with the test."""
    yield lab_server
    lab_server.shut_down_kernels()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    yield page
    context.close()


