"""python3 scripts/gpucheck [ARG...]: scripts/gpu_check's program (cli.py)."""
import os
import sys

if __package__ in (None, ""):  # run as a folder: import it as the package it is
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from gpucheck.cli import main  # noqa: E402

sys.exit(main(sys.argv[1:]))
