#!/usr/bin/env bash
# tests/python/pip_install.sh PYTHON SOURCE BUILD WORK: `pip install .` of
# SOURCE into a fresh virtual environment (made by PYTHON), against BUILD's
# cmake --install in WORK/prefix, so that only the extension compiles; then
# `import mp` prints the version from another directory, and the wheel holds
# the extension and the package's Python files. CTest python_pip_install.
set -euo pipefail
python=$1 source=$2 build=$3 work=$4
rm -rf "$work"
mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
"$python" -m venv "$work/venv"
venv_python=$work/venv/bin/python
# The build backend and nanobind, from PyPI (what an isolated build would fetch).
"$venv_python" -m pip install -q scikit-build-core nanobind
"$venv_python" -m pip install -q --no-build-isolation -C "cmake.define.MP_PREFIX=$work/prefix" \
  -C "build-dir=$work/build" "$source"
cd "$work"
version=$("$venv_python" -c "import mp; print(mp.version())")
want=$(sed -n 's/^project(mp VERSION \([0-9.]*\).*/\1/p' "$source/CMakeLists.txt")
echo "import mp: version $version"
[[ $version == "$want" ]] || { echo "FAIL: mp.version() is '$version', CMakeLists.txt says '$want'"; exit 1; }
location=$("$venv_python" -c "import mp, os; print(os.path.dirname(mp.__file__))")
for f in __init__.py _shard.py torch.py; do [[ -f $location/$f ]] || { echo "FAIL: $location/$f missing"; exit 1; }; done
compgen -G "$location/_mp*.so" > /dev/null || { echo "FAIL: no extension in $location"; exit 1; }
echo "pip install . in a fresh venv: OK ($location)"
