#!/usr/bin/env python3
"""tests/check_ptxas.py: hot CUDA kernels keep no stack frame and no spills;
every kernel fits the launches it is given.

Reads ptxas' resource report that the build leaves beside each CUDA object
(OBJECT.ptxas, cmake/MpPtxasReport.cmake) and checks every kernel whose
demangled name matches a pattern of the hot list: on every architecture the
build compiled machine code for, 0 bytes of stack frame, 0 bytes of spill
stores and loads, and no stack in the functions it calls either (ptxas'
cumulative stack size). A pattern that matches no kernel is an error too,
so a renamed kernel cannot drop out of the check unnoticed.

  check_ptxas.py [--hot FILE] [--pattern PATTERN]... [--verbose] OBJECT...

A pattern is a piece of a demangled kernel name, `*` standing for any run of
characters (tests/ptxas_hot_kernels.txt, one a line). Objects that are not
CUDA objects (*.cu.o) are ignored, so the test can pass a target's whole
object list (as arguments, or as one ;-separated CMake list).

With --launches BINARY (tests/test_gpu_launch_limits.cc's binary, whose
--table gives each kernel's widest block and declared static shared memory,
kernels/cuda_launch.h): every kernel in the reports must have a line there
(a kernel of mp's launched without a configuration from
kernels/cuda_launch.h fails; a library's own, such as CUB's sort, is the
library's), its static shared memory must be at most the declared, and its
registers must let its widest block start (65536 a block, allocated per
warp in units of 256).

Exit 0: every hot kernel is clean; 1: a violation or an unmatched pattern,
each named; 2: bad input (a report missing or older than its object, a list
that cannot be read).
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

ENTRY = re.compile(r"^ptxas info\s*: Compiling entry function '([^']+)' for '(sm_\w+)'")
PROPERTIES = re.compile(r"^ptxas info\s*: Function properties for (\S+)")
FRAME = re.compile(r"^\s+(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
USED = re.compile(r"^ptxas info\s*: Used (\d+) registers")
CUMULATIVE = re.compile(r"(\d+) bytes cumulative stack size")
SMEM = re.compile(r"(\d+) bytes smem")


class InputError(Exception):
    pass


@dataclass
class Kernel:
    mangled: str
    arch: str
    report: str
    registers: int = -1
    frame: int = -1
    spill_stores: int = -1
    spill_loads: int = -1
    cumulative: int = 0  # ptxas prints it only when nonzero
    smem: int = 0  # static shared memory; ptxas prints it only when nonzero
    name: str = ""

    def problems(self):
        out = []
        if self.frame != 0:
            out.append(f"{self.frame} bytes stack frame")
        if self.spill_stores != 0:
            out.append(f"{self.spill_stores} bytes spill stores")
        if self.spill_loads != 0:
            out.append(f"{self.spill_loads} bytes spill loads")
        if self.cumulative > self.frame:
            out.append(f"{self.cumulative} bytes cumulative stack size (with its callees')")
        return out

    def describe(self):
        return (f"{self.arch} {self.name}: {self.frame} bytes stack frame, {self.spill_stores} bytes spill stores, "
                f"{self.spill_loads} bytes spill loads, {self.cumulative} bytes cumulative stack, "
                f"{self.registers} registers [{self.report}]")


def parse_report(text, report):
    """The kernels (entry functions) of one ptxas report, in order."""
    kernels = []
    current = None  # the kernel being compiled
    properties_of = None  # the function whose "Function properties" block is open
    for number, line in enumerate(text.splitlines(), 1):
        m = ENTRY.match(line)
        if m:
            current = Kernel(m.group(1), m.group(2), report)
            kernels.append(current)
            properties_of = None
            continue
        m = PROPERTIES.match(line)
        if m:
            properties_of = m.group(1)
            continue
        m = FRAME.match(line)
        if m:
            if current is not None and properties_of == current.mangled:
                current.frame, current.spill_stores, current.spill_loads = map(int, m.groups())
            properties_of = None
            continue
        m = USED.match(line)
        if m:
            if current is None:
                raise InputError(f"{report}:{number}: register count outside any kernel: {line.strip()}")
            current.registers = int(m.group(1))
            c = CUMULATIVE.search(line)
            current.cumulative = int(c.group(1)) if c else 0
            m = SMEM.search(line)
            current.smem = int(m.group(1)) if m else 0
    for k in kernels:
        if k.registers < 0 or k.frame < 0:
            raise InputError(f"{report}: kernel {k.mangled} ({k.arch}) has no "
                             f"{'register count' if k.registers < 0 else 'stack frame line'}")
    return kernels


def read_reports(objects):
    kernels = []
    reports = 0
    for obj in (o for arg in objects for o in arg.split(";") if o):
        if not obj.endswith(".cu.o"):
            continue
        report = obj + ".ptxas"
        if not os.path.exists(report):
            raise InputError(f"no ptxas report beside {obj}: its target must call mp_ptxas_report() "
                             "(cmake/MpPtxasReport.cmake), and the object must be built")
        if not os.path.exists(obj):
            raise InputError(f"{obj} does not exist: build it first")
        if os.path.getmtime(report) < os.path.getmtime(obj):
            raise InputError(f"{report} is older than its object: the object was built without "
                             "cmake/ptxas_report.sh")
        with open(report, encoding="utf-8", errors="replace") as f:
            kernels += parse_report(f.read(), report)
        reports += 1
    if reports == 0:
        raise InputError("no CUDA object (*.cu.o) among the objects given")
    return kernels


def demangle(kernels):
    cxxfilt = shutil.which("c++filt")
    if cxxfilt is None:
        raise InputError("c++filt (binutils) is not on PATH: it demangles the kernel names")
    names = "\n".join(k.mangled for k in kernels) + "\n"
    out = subprocess.run([cxxfilt], input=names, capture_output=True, text=True, check=True).stdout.splitlines()
    if len(out) != len(kernels):
        raise InputError(f"c++filt returned {len(out)} names for {len(kernels)}")
    for k, name in zip(kernels, out):
        k.name = name


def read_patterns(path):
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise InputError(f"cannot read the hot-kernel list {path}: {e.strerror}") from e
    patterns = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if not patterns:
        raise InputError(f"{path} lists no pattern")
    return patterns


def pattern_regex(pattern):
    return re.compile(".*".join(re.escape(piece) for piece in pattern.split("*")))


def check(kernels, patterns, verbose):
    """Prints the verdict; returns the number of failures."""
    failures = 0
    archs = sorted({k.arch for k in kernels})
    print(f"{len(kernels)} kernels in the reports, machine code for {', '.join(archs) or 'no architecture'}")
    for pattern in patterns:
        regex = pattern_regex(pattern)
        matched = [k for k in kernels if regex.search(k.name)]
        if not matched:
            print(f"FAIL: pattern '{pattern}' matches no kernel: renamed or removed? "
                  "Fix the hot-kernel list (tests/ptxas_hot_kernels.txt).")
            failures += 1
            continue
        bad = [k for k in matched if k.problems()]
        for k in bad:
            print(f"FAIL: '{pattern}': {k.arch} {k.name}: {', '.join(k.problems())} "
                  f"({k.registers} registers) [{k.report}]")
        failures += len(bad)
        for arch in sorted({k.arch for k in matched}):
            of_arch = [k for k in matched if k.arch == arch]
            regs = [k.registers for k in of_arch]
            clean = sum(1 for k in of_arch if not k.problems())
            print(f"{'ok  ' if clean == len(of_arch) else 'FAIL'}: '{pattern}' {arch}: {len(of_arch)} kernels, "
                  f"{clean} with no stack frame and no spills, {min(regs)}-{max(regs)} registers")
        if verbose:
            for k in matched:
                print("  " + k.describe())
    return failures


def read_launches(binary):
    """{kernel name: (threads, dynamic bytes, static bytes)} from BINARY --table."""
    try:
        out = subprocess.run([binary, "--table"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise InputError(f"{binary} --table failed: {e}") from e
    table = {}
    for line in out.splitlines():
        name, threads, dynamic, static = line.split()
        table[name] = (int(threads), int(dynamic), int(static))
    if not table:
        raise InputError(f"{binary} --table printed no kernel")
    return table


def base_name(demangled):
    """'void mp::(anonymous namespace)::update_kernel<...>(...)' -> 'update_kernel'."""
    plain = demangled.replace("(anonymous namespace)", "")
    head = re.split(r"[<(]", plain, maxsplit=1)[0]
    return head.rsplit("::", 1)[-1].split()[-1]


def check_launches(kernels, table):
    """Static shared memory and registers against each kernel's launches; returns the failures."""
    failures = 0
    seen = set()
    for k in kernels:
        if not re.match(r"(void )?mp::", k.name):
            continue  # a library's own kernel (CUB's sort), launched by the library
        name = base_name(k.name)
        seen.add(name)
        if name not in table:
            print(f"FAIL: {k.arch} {k.name}: launched with no configuration from kernels/cuda_launch.h "
                  f"(tests/test_gpu_launch_limits.cc lists none) [{k.report}]")
            failures += 1
            continue
        threads, _, static = table[name]
        warps = -(-threads // 32)
        per_warp = -(-k.registers * 32 // 256) * 256
        problems = []
        if k.smem > static:
            problems.append(f"{k.smem} bytes of static shared memory, {static} declared")
        if warps * per_warp > 65536:
            problems.append(f"{k.registers} registers x {threads} threads: {warps * per_warp} of 65536 a block")
        for p in problems:
            print(f"FAIL: {k.arch} {k.name}: {p} [{k.report}]")
        failures += len(problems)
    for name in sorted(set(table) - seen):
        print(f"FAIL: kernels/cuda_launch.h configures '{name}', which no report holds: renamed or removed?")
        failures += 1
    print(f"{len(kernels)} kernel builds (mp's) against the launches of {len(table)} kernels: {failures} failures")
    return failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hot", action="append", default=[], help="a file of patterns, one a line")
    parser.add_argument("--pattern", action="append", default=[], help="one more pattern")
    parser.add_argument("--verbose", action="store_true", help="print every matched kernel's numbers")
    parser.add_argument("--launches", help="a binary whose --table lists each kernel's launches")
    parser.add_argument("objects", nargs="+")
    args = parser.parse_args()
    try:
        patterns = [p for path in args.hot for p in read_patterns(path)] + args.pattern
        if not patterns and not args.launches:
            raise InputError("no pattern: pass --hot FILE or --pattern PATTERN")
        kernels = read_reports(args.objects)
        if not kernels:
            raise InputError("the ptxas reports hold no kernel compiled to machine code "
                             "(CMAKE_CUDA_ARCHITECTURES with only virtual architectures?)")
        demangle(kernels)
        failures = check(kernels, patterns, args.verbose) if patterns else 0
        if args.launches:
            failures += check_launches(kernels, read_launches(args.launches))
    except InputError as e:
        print(f"check_ptxas.py: {e}", file=sys.stderr)
        return 2
    if failures:
        print(f"{failures} failures (docs/testing.md)")
        return 1
    print("every hot kernel keeps no stack frame and no spills" if patterns else "every kernel fits its launches")
    return 0


if __name__ == "__main__":
    sys.exit(main())
