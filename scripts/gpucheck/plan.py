"""The stages of a call, and how a call's deadline is shared among them.

Pure functions of the stage table and the statuses so far, so that the
rules are tested without running anything (tests/gpu_check/test_judgements.py).
"""
import re
from collections import namedtuple

# limit_s: the most a stage may take (about twice its expected time on a
# 16-core H100 or H200 machine, docs/gpu.md), so that a hung stage leaves
# the rest of the call its time.
# expected_s: the seconds it is expected to take (measured where docs/gpu.md
# says so, with a margin): what an earlier stage of the call leaves it.
# after_smoke: it runs the worker on the device, which a failed smoke run of
# the same call shows does not train there (it would spend its limit failing
# the same way).
# device: it needs a CUDA device; a rehearsal (MP_GPU_CHECK_DEVICE=CPU) skips
# it (update runs the CPU's suite there instead: its logic at a second's cost).
Stage = namedtuple("Stage", "name limit_s expected_s after_smoke device")

STAGES = [
    Stage("build", 420, 100, False, False),   # 80 s measured bare before cuDNN attention and gemm_cuda
    Stage("tests", 300, 150, False, True),    # took its whole 300 s in the first run (a hang)
    Stage("memcheck", 450, 200, False, True),  # expected 2-4 min
    Stage("smoke", 120, 5, False, False),     # 2 s measured
    Stage("agree", 300, 25, True, False),     # 20 s measured
    Stage("gemm", 180, 25, False, True),      # expected under 0.5 min
    Stage("update", 180, 10, False, False),   # 8 s measured
    Stage("faults", 360, 150, True, False),   # expected 1.5-2.5 min
    Stage("gpt2", 450, 70, True, False),      # without torch.compile: it runs only where time is left
    Stage("report", 60, 5, False, False),
]
BY_NAME = {s.name: s for s in STAGES}
ALL_STAGES = [s.name for s in STAGES]
# The call without arguments: docs/gpu.md's first command.
FIRST_COMMAND = ["build", "tests", "smoke", "agree", "gemm", "update", "gpt2"]

HAND_BACK_S = 20  # kept at the end of a call for writing and handing back its files
LEAST_S = 30      # a stage with less than this left is skipped

STATUSES = ("pass", "fail", "timeout", "interrupted", "skipped", "running", "pending")


def unknown(stages):
    """The names among `stages` that are no stage."""
    return [s for s in stages if s not in BY_NAME]


def tarball_name(stages):
    return "gpu_check_" + re.sub(r"[^A-Za-z0-9_-]", "_", "-".join(stages)) + ".tar.gz"


def own_limits(text):
    """MP_GPU_CHECK_STAGE_S ("tests=120 gpt2=300"): stages' own limits in
    place of the table's. ValueError on a bad entry."""
    limits = {}
    for item in text.split():
        name, _, value = item.partition("=")
        if name not in BY_NAME or not value.isdigit() or int(value) < 1:
            raise ValueError(f"MP_GPU_CHECK_STAGE_S: '{item}' is not STAGE=SECONDS with a stage of "
                             f"{' '.join(ALL_STAGES)}")
        limits[name] = int(value)
    return limits


def skip_reason(stage, status, device, ctests_given, deadline_s, elapsed_s):
    """Why `stage` will not run in this call (None: it runs). status: each
    stage's status so far; ctests_given: a rehearsal named a CTest folder
    for `tests` (MP_GPU_CHECK_CTESTS)."""
    s = BY_NAME[stage]
    if status.get("build") in ("fail", "timeout") and stage != "report":
        return "the build failed"
    if s.after_smoke and status.get("smoke") in ("fail", "timeout"):
        return ("the smoke run failed: the worker does not train on this device "
                f"(scripts/gpu_check build {stage} runs it alone)")
    if device != "CUDA" and s.device and not (stage == "tests" and ctests_given):
        return f"it needs a CUDA device (this call: MP_GPU_CHECK_DEVICE={device})"
    if deadline_s > 0 and deadline_s - elapsed_s - HAND_BACK_S < LEAST_S:
        return f"no time left before the call's deadline ({deadline_s} s)"
    return None


def limit_of(stage, stages, status, deadline_s, elapsed_s, limits=None):
    """The seconds `stage` may take: its own limit, or what is left before
    the deadline once the expected times of the call's later pending stages
    are set aside (unless that would leave it less than its own expected
    time: then all that is left)."""
    limit = (limits or {}).get(stage, BY_NAME[stage].limit_s)
    if deadline_s <= 0:
        return limit
    left = deadline_s - elapsed_s - HAND_BACK_S
    later = stages[stages.index(stage) + 1:]
    reserve = sum(BY_NAME[s].expected_s for s in later if status.get(s) == "pending")
    own_need = min(BY_NAME[stage].expected_s, limit)
    if left - reserve >= own_need:
        left -= reserve
    return max(1, int(min(limit, left)))
