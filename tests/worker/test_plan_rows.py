"""mp_worker --plan --memory-per-rank: the configurations it lists fit the
budget and each runs in the bytes it says. CTest worker_plan_rows_np2.

  The table of a 3-layer GPT for 2 ranks within 15 MiB: every row within the
  budget, rows ordered by communication per step, the choice a row of the
  config's recipe (bf16_master).
  Four of its rows, run for one step on 2 ranks with the row's --set flags,
  take exactly the bytes per rank the row says (the measured categories of
  metrics.jsonl's first record, "other" aside: a few hundred bytes of step
  scalars the plan leaves out): the chosen one, the first that recomputes
  every unit, the first that recomputes every 2nd, and the first of another
  strategy with several micro-batches.
  A budget nothing fits lists no row and chooses none; --ranks-per-host 3 of
  a world of 4 exits 2 naming both.
"""
import re
import shlex

import pytest
from mpworker import logged, metrics, sets

SMALL = sets("model.gpt.layers=3", "model.gpt.context=32", "data.micro_batch_size=4", "val_interval=0",
             "sample_interval=0")
BUDGET = 15 << 20
ROW = re.compile(r"^\s*(\d+)(\*?)\s+(\S+)\s+(\S+)\s+(none|every unit|every 2nd)\s+(\d+)x(\d+)\s+(\d+)\s+\S+ \S+\s+"
                 r"(\S+) (\S+)\s+(.*)$")
UNIT = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


@pytest.fixture(scope="module")
def w(worker):
    return worker.with_base(*SMALL)


@pytest.fixture(scope="module")
def plan(w):
    """The table's rows (n, chosen, strategy, recompute, micro, bytes, comm, sets) and its output."""
    run = w.run("plan", ["--plan", "--memory-per-rank", BUDGET, "--world-size", 2, "--plan-rows", 0], np=None)
    assert run.rc == 0, str(run)
    rows = []
    for line in run.log.splitlines():
        m = ROW.match(line)
        if m:
            rows.append(dict(n=int(m[1]), chosen=bool(m[2]), strategy=m[3], recompute=m[5], micro=int(m[6]),
                             bytes=int(m[8]), comm=float(m[9]) * UNIT[m[10]],
                             sets=[] if m[11].startswith("(") else shlex.split(m[11])))
    assert rows, str(run)
    return rows, run


def chosen(rows):
    return next(r for r in rows if r["chosen"])


PICKS = {
    "the chosen row": chosen,
    "the first that recomputes every unit": lambda rows: next(r for r in rows if r["recompute"] == "every unit"),
    "the first that recomputes every 2nd": lambda rows: next(r for r in rows if r["recompute"] == "every 2nd"),
    "the first of another strategy with micro-batches":
        lambda rows: next(r for r in rows if r["micro"] > 1 and r["strategy"] != chosen(rows)["strategy"]),
}


def test_every_listed_row_fits_the_budget(plan):
    rows, _ = plan
    over = [r for r in rows if r["bytes"] > BUDGET]
    assert not over, f"rows over the budget of {BUDGET} bytes: {over}"


def test_rows_are_ordered_by_communication_per_step(plan):
    rows, _ = plan
    out_of_order = [(a["n"], b["n"]) for a, b in zip(rows, rows[1:]) if a["comm"] > b["comm"] * 1.01]
    assert not out_of_order, f"rows before a row with less communication: {out_of_order}"


def test_choice_is_a_row_of_the_configs_recipe(plan):
    rows, run = plan
    logged(run, rf"^choice: row {chosen(rows)['n']}, the config's recipe \(bf16_master\)")


@pytest.mark.parametrize("pick", PICKS)
def test_listed_row_runs_in_the_bytes_it_plans(w, tmp_path_factory, plan, pick):
    row = PICKS[pick](plan[0])
    out = tmp_path_factory.getbasetemp() / f"row{row['n']}"
    run = w.run(f"row{row['n']}", [*row["sets"], "--steps", 1, "--out", out])
    assert run.rc == 0, str(run)
    memory = metrics(out)[0]["memory_bytes"]
    measured = sum(v for k, v in memory.items() if k != "other")
    assert measured == row["bytes"], f"row {row['n']} ({shlex.join(row['sets'])}): planned {row['bytes']} bytes " \
                                     f"per rank, measured {measured}: {memory}"


def test_budget_nothing_fits_lists_no_row_and_chooses_none(w):
    run = w.run("none", ["--plan", "--memory-per-rank", "1KiB", "--world-size", 2], np=None)
    assert run.rc == 0, str(run)
    logged(run, r"^0 of [0-9]+ configurations fit; the smallest needs")
    assert not [line for line in run.log.splitlines() if ROW.match(line)], str(run)
    logged(run, r"^choice: none")


def test_ranks_per_host_that_does_not_divide_the_world_exits_2(worker):
    run = worker.run("bad", ["--plan", "--memory-per-rank", "1GiB", "--world-size", 4, "--ranks-per-host", 3], np=None)
    assert run.rc == 2, str(run)
    logged(run, "ranks-per-host 3 does not divide the world size 4")
