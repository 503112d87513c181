"""The options and fixtures of mp_worker's end-to-end tests (mpworker.py)."""
from mpworker import add_options, measured, terminal_summary, worker  # noqa: F401 (fixtures)


def pytest_addoption(parser):
    add_options(parser)


def pytest_terminal_summary(terminalreporter):
    terminal_summary(terminalreporter)
