"""scripts/gpucheck: the program behind scripts/gpu_check (plain Python 3,
standard library only: a GPU machine has a python3, maybe no packages).

  cli.py          the usage text and the entry point
  call.py         one call: its stages under the deadline, the two files it hands back
  plan.py         the stages' table, limits and skip rules
  proc.py         running commands: logs, timeouts, process groups, rank launches
  env.py          the settings, the libraries (.gpu_deps, NCCL, cuDNN), the machine
  context.py      what a stage is handed: the call's context and its own rows
  build_stages.py build, tests, memcheck
  run_stages.py   smoke, agree, gemm, update, faults, gpt2, report
  judge.py        the judgements of the stages' outputs
  report.py       result rows, the summary, the tarball, the table, merge
"""
