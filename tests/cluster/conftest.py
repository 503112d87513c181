"""The options and fixtures of the emulated-cluster tests: those of mp_worker's
end-to-end tests (tests/worker/mpworker.py)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "worker"))
from mpworker import add_options, measured, terminal_summary, worker  # noqa: E402,F401 (fixtures)


def pytest_addoption(parser):
    add_options(parser)


def pytest_terminal_summary(terminalreporter):
    terminal_summary(terminalreporter)
