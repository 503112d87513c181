#!/bin/sh
# cmake/ptxas_report.sh COMPILER ARGS...: the CUDA compiler launcher that
# mp_ptxas_report (cmake/MpPtxasReport.cmake) puts in front of a target's
# compiles. The compile prints ptxas' resource report (--resource-usage) on
# stderr; this moves those lines into OBJECT.ptxas, OBJECT being the
# argument after -o, and passes every other line through. The exit code is
# the compiler's; a failed compile leaves no report. ccache (next in the
# command when the build uses it) replays the report on a cache hit.
set -u
obj=
prev=
for arg in "$@"; do
  [ "$prev" = -o ] && obj=$arg
  prev=$arg
done
if [ -z "$obj" ]; then
  echo "ptxas_report.sh: no '-o OBJECT' in: $*" >&2
  exit 2
fi
report=$obj.ptxas
rm -f "$report" "$report.tmp"
"$@" 2>"$report.stderr"
rc=$?
lines='^(ptxas info *:| +[0-9]+ bytes stack frame)'
grep -E "$lines" "$report.stderr" >"$report.tmp"
grep -vE "$lines" "$report.stderr" >&2
rm -f "$report.stderr"
if [ "$rc" -eq 0 ]; then
  mv "$report.tmp" "$report"
else
  rm -f "$report.tmp"
fi
exit "$rc"
