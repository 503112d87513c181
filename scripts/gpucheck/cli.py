"""scripts/gpu_check [STAGE ...]: on a machine with a CUDA GPU, the proof
that mp builds, passes its GPU tests, agrees with the CPU and trains fast
there, in stages. Made for a GPU machine reached by commands of at most 10
minutes that hand back at most 8 files; docs/gpu.md is the runbook (the two
commands of a 15-minute session, what each prints last, what to do when a
stage fails, how to record the numbers).

  scripts/gpu_check                   the first command: build tests smoke
                                      agree gemm update gpt2, within 540 s
  scripts/gpu_check build memcheck    the second
  scripts/gpu_check --env CMD [ARG]   CMD in the stages' environment (the
                                      carried libraries, NCCL, cuDNN,
                                      NCCL_DEBUG); prints only, hands back nothing
  scripts/gpu_check --merge OUT SUMMARY...
                                      several calls' summaries in one report
                                      (bench/results/gpu_check.json), and the table

Stages, in the order a call runs them:
  build     cmake MP_CUDA=ON, Release, sm_90, only the binaries the call's
            stages run, -j$(nproc); seconds when the build folder is kept
  tests     every CTest of label gpu, all at once, each ended 15 s before
            the stage's end whatever its own TIMEOUT; a row per test as it ends
  memcheck  the same CTests under compute-sanitizer memcheck, 5 at a time
  smoke     the default GPT, 10 steps, MP_CUDA_SYNC=1
  agree     the default GPT on the GPU and the CPU: fp32 within 2e-3 every
            step, bf16_master's final loss within 0.05 nats; checkpoint,
            verify, export, resume
  gemm      mp_bench gemm_cuda: every GEMM of a GPT-2 124M step, its plan
  update    mp_bench update_cuda: the fused AdamW step against a copy
  faults    kill, hang, nan, device_fault on GPU ranks
  gpt2      GPT-2 124M at B = 4 and 16: tokens/s, MFU, ops per step, the
            attention path, against PyTorch eager (and torch.compile where
            time is left); each row written as soon as its run ends
  report    every STAGE.jsonl of the results folder in gpu_check.json
A failed smoke skips agree, faults and gpt2 (they run the worker on the
device); nothing else depends on an earlier stage but on build. Every rank
launch is `mpirun --bind-to none`.

One call ends within MP_GPU_CHECK_DEADLINE_S (default 540; 0: none): each
stage runs under its own limit or what is left once the later stages'
expected times are set aside; writes exactly two files in $OUT (STATE/out
when OUT is unset): gpu_check_<stages>.tar.gz and gpu_check_summary.json,
at the start, after every stage, on SIGTERM or SIGINT and on exit; keeps
the build and STATE/STAGE.jsonl (STATE: build-gpu/gpu_check) for later
calls. Exit status: 0 when every stage passed, 1 otherwise, 2 for a bad
stage name.

A bare GPU machine lacks protoc, mpirun and oneDNN: run scripts/gpu_deps
where Debian's mirror is reachable (it fills .gpu_deps/ with .deb files
and the cuDNN frontend's headers, about 24 MB) and copy .gpu_deps/ beside
the checkout; build unpacks it into /opt/mpdeps (dpkg-deb -x: no apt, no
network).

cuDNN comes from the toolkit or, where it has none, from PyTorch's wheel:
its nvidia/cudnn folder and its NVRTC on LD_LIBRARY_PATH.

Environment [defaults]:
  MP_GPU_BUILD                  the build folder [build-gpu]
  MP_GPU_CHECK_STATE            the results folder [BUILD/gpu_check]
  OUT                           where the two files go [STATE/out]
  MP_GPU_CHECK_DEADLINE_S       the call's deadline [540; 0: none]
  MP_GPU_CHECK_STAGE_S          stages' own limits, e.g. "tests=120 gpt2=300"
  MP_GPU_CHECK_STEPS            agree's steps [100]
  MP_GPU_CHECK_TEST_JOBS        GPU tests at once [8]
  MP_GPU_CHECK_MEMCHECK_JOBS    memcheck's tests at once [5]
  MP_GPU_CHECK_MEMCHECK_TEST_S  memcheck's limit per test [150]
  MP_GPU_CHECK_GPT2_ARGS        worker flags for gpt2's runs
  MP_GPU_CHECK_GPT2_BATCHES     gpt2's batches ["4 16"]
  MP_GPU_CHECK_GPT2_STEPS       gpt2's steps [30]
  MP_GPU_CHECK_TORCH_ARGS       bench/torch_gpt.py's flags
  MP_GPU_CHECK_TORCH_MODES      its modes [amp_bf16,amp_bf16_compile]
  MP_GPU_CHECK_COMPILE_S        what a torch.compile mode needs [120]
  MP_PEAK_TFLOPS                the peak of MFU [989]
  MP_GPU_CHECK_CUDNN            auto, toolkit or wheel [auto]
  MP_GPU_CHECK_COMMIT           the commit, where the checkout has no .git
  MP_GPU_CHECK_PYTHON           the Python that runs this and PyTorch [python3]
  MP_GPU_CHECK_DEVICE           CPU: a rehearsal [CUDA]
  MP_GPU_CHECK_CTESTS           the CTest folder of tests [the build folder]
NCCL_DEBUG is WARN unless set; MP_CUDA_SYNC is cleared except in smoke.

MP_GPU_CHECK_DEVICE=CPU rehearses the stages' own logic on a machine
without a GPU, against an existing build (CPU against CPU: not a GPU
check): the stages that need a device are skipped, saying so, update runs
the CPU's suite at a small size, and tests runs where MP_GPU_CHECK_CTESTS
names a CTest folder.
"""
import os
import sys

from . import plan, report
from . import env as envmod
from .call import Call

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv, environ=None):
    environ = dict(os.environ if environ is None else environ)
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if argv and argv[0] == "--merge":
        if len(argv) < 3:
            print("usage: scripts/gpu_check --merge OUT_JSON SUMMARY...", file=sys.stderr)
            return 2
        return report.merge(argv[1], argv[2:])
    os.chdir(ROOT)
    try:
        settings = envmod.Settings(ROOT, environ)
    except ValueError as e:
        print(f"gpu_check: {e}", file=sys.stderr)
        return 2
    if argv and argv[0] == "--env":
        if len(argv) < 2:
            print("usage: scripts/gpu_check --env CMD [ARG...]", file=sys.stderr)
            return 2
        try:
            env, _, _ = envmod.stage_environment(settings, environ)
        except OSError as e:
            print(f"gpu_check: {e}", file=sys.stderr)
            return 1
        os.execvpe(argv[1], argv[1:], env)
    return Call(settings, argv or list(plan.FIRST_COMMAND), environ).run()
