#!/usr/bin/env bash
# tests/check_dockerfile.sh SOURCE: what can be checked of docker/Dockerfile
# without a Docker engine: every path a COPY takes from the build context
# exists in the repository, the build stage installs every package
# scripts/setup installs (except tools the image does not need), and the
# build configures the CUDA parts on.
set -euo pipefail
src=$1
df=$src/docker/Dockerfile
fail() { echo "FAIL: $*"; exit 1; }
copies=0
while read -r _ rest; do
  [[ $rest == --from=* ]] && continue
  read -ra args <<<"$rest"
  for path in "${args[@]:0:${#args[@]}-1}"; do
    [[ -e $src/$path ]] || fail "docker/Dockerfile copies '$path', which the repository lacks"
    copies=$((copies + 1))
  done
done < <(grep -E '^COPY ' "$df")
[[ $copies -gt 0 ]] || fail "no COPY lines found"
# Every top-level source directory the build needs is copied: each folder
# the top-level CMakeLists.txt adds (the layers, bench, examples) and what
# its configure reads.
subdirs=$(sed -n 's/^add_subdirectory(\([a-z_]*\))/\1/p' "$src/CMakeLists.txt" | grep -vx tests)
[[ -n $subdirs ]] || fail "no add_subdirectory() found in CMakeLists.txt"
for dir in cmake mp include configs $subdirs; do
  grep -qE "^COPY $dir/ " "$df" || fail "docker/Dockerfile does not copy $dir/ (add_subdirectory or include needs it)"
done
# The packages of scripts/setup, but for tools the image has no use for.
skip=" ccache clang libclang-rt-14-dev clang-format cmake iproute2 util-linux slurmd slurmctld slurm-client munge stress-ng "
packages=$(sed -n '/^packages=(/,/^)/p' "$src/scripts/setup" | sed 's/#.*//' | tr ' ' '\n' | grep -E '^[a-z0-9][a-z0-9.+-]+$' | grep -v packages)
for p in $packages; do
  [[ $skip == *" $p "* ]] && continue
  grep -qE "(^|[[:space:]])$p([[:space:]]|$)" "$df" || fail "scripts/setup installs $p; docker/Dockerfile does not"
done
grep -q -- "-DMP_CUDA=ON" "$df" || fail "the image must build the CUDA parts (-DMP_CUDA=ON)"
grep -q "cmake --install build --prefix /opt/mp" "$df" || fail "the build stage must install into /opt/mp"
echo "docker/Dockerfile: $copies copied paths exist; it installs scripts/setup's packages; CUDA on"
echo PASS
