#!/usr/bin/env bash
# tests/install_tree.sh BUILD SOURCE WORK MPRUN: `cmake --install` of BUILD
# into WORK/prefix; then examples/ built as a project of its own against
# that prefix (find_package(mp), mp::runtime and mp::c), both hosts run
# under mpirun, and the C host compiled once more from a plain compiler
# command line with pkg-config's flags. Nothing is read from BUILD or the
# source tree's headers after the install.
set -euo pipefail
build=$1 src=$2 work=$3 mprun=$4
rm -rf "$work"
mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" > "$work/install.log" || { cat "$work/install.log"; fail "install"; }
for f in bin/mp_worker bin/mprun bin/mp_node lib/cmake/mp/mpConfig.cmake lib/cmake/mp/mpConfigVersion.cmake \
         lib/pkgconfig/mp.pc include/mp/mp.h include/mp/mp_c.h include/mp/mp/config.h include/mp/proto/mp.pb.h \
         include/mp/runtime/engine.h share/mp/configs/default.textproto; do
  [[ -e $prefix/$f ]] || fail "the install lacks $f"
done
echo "installed $(find "$prefix" -type f | wc -l) files into $prefix"
"$prefix/bin/mp_worker" --version | head -n 1

cmake -S "$src/examples" -B "$work/examples" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
  > "$work/configure.log" 2>&1 || { cat "$work/configure.log"; fail "configure examples/ against the install"; }
cmake --build "$work/examples" > "$work/build.log" 2>&1 || { tail -n 40 "$work/build.log"; fail "build examples/"; }
grep -q -- "-I$src" "$work/examples/build.ninja" && fail "the examples' build reads headers from the source tree"
echo "examples/ built against the install (find_package(mp): mp::runtime, mp::c)"

"$mprun" -np 2 --bind-to none "$work/examples/host_trainer" || fail "host_trainer from the install"
"$mprun" -np 2 --bind-to none "$work/examples/c_host" "$work/ckpt" || fail "c_host from the install"

flags=$(PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --cflags --libs mp)
echo "pkg-config --cflags --libs mp: $flags"
# shellcheck disable=SC2086
cc -std=c11 -o "$work/c_host_pkgconfig" "$src/examples/c_host.c" $flags || fail "cc with pkg-config's flags"
"$mprun" -np 2 --bind-to none "$work/c_host_pkgconfig" "$work/ckpt_pc" || fail "c_host built with pkg-config"
echo PASS
