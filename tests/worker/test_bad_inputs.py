"""Hand-written bad inputs to mp_worker (the cases: bad_inputs.py), run bare:
world size 1, no launcher (mpirun adds 2 s a case and only its own notice).
CTest worker_bad_inputs.

  test_bad_input_ends_with_its_exit_code_and_message[CASE]: config files,
      --set overrides, token files, checkpoints (a copy of one the MLP saved,
      damaged), devices and environment variables: each ends with its exit
      code and its exact message (DIR stands for the scratch directory),
      within 60 s, leaving no worker process.
  test_reliability_md_shows_every_message: docs/reliability.md's "Bad input"
      table shows every case's message.
"""
import pytest
from bad_inputs import CASES, CHECKPOINT, MLP, ROOT
from mpworker import Checkpoints


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    return tmp_path_factory.getbasetemp()


@pytest.fixture(scope="module")
def saved_checkpoint(worker, d):
    """The MLP's checkpoint after 2 steps, in DIR/run/checkpoints."""
    run = worker.run("save", [*MLP, "--out", d / "run", "--set", "checkpoint.save_at_end=true"], np=None, timeout=60)
    assert run.rc == 0, str(run)
    assert Checkpoints(d / "run" / "checkpoints").latest == CHECKPOINT
    return d / "run" / "checkpoints"


@pytest.mark.parametrize("case", CASES, ids=[c.what for c in CASES])
def test_bad_input_ends_with_its_exit_code_and_message(worker, d, request, case):
    if case.checkpoint:
        request.getfixturevalue("saved_checkpoint")
    if case.files:
        case.files(d)
    run = worker.run(f"case{CASES.index(case)}", case.args(d), np=None, env=case.env, timeout=60)
    got = run.log.replace(str(d), "DIR")
    assert (run.rc, case.message in got) == (case.exit, True), (
        f"{case.what}: exit {run.rc} (want {case.exit}); want the message\n    {case.message}\ngot:\n" +
        "\n".join("    " + line for line in got.splitlines()[-15:]))
    assert run.left_running == []


def test_reliability_md_shows_every_message():
    table = (ROOT / "docs" / "reliability.md").read_text()
    missing = [c.message for c in CASES if c.message not in table]
    assert not missing, "docs/reliability.md's bad-input table lacks:\n" + "\n".join(missing)
