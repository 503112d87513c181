"""A checkout with .gpu_deps (scripts/gpu_deps) configures and runs its
carried libraries as on a bare GPU machine without network: the build
stage's own set-up (gpucheck.env.carried_deps: the .deb files unpacked with
dpkg-deb, no apt) into a fresh prefix, then, with no network (a network
namespace of its own holding only a loopback, where the machine lets a
test make one: unshare -rn), CMake configures mp (MP_CUDA=OFF: a configure
is seconds, a build is not) with its system search paths off, so that
every library must come from the prefix; protoc from the prefix compiles
mp's protos, and a program built with the prefix's mpicxx runs on 2 ranks
under its mpirun, loading its libmpi."""
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
from conftest import ROOT

from gpucheck import env as envmod

GPU_DEPS = os.environ.get("MP_GPU_DEPS") or os.path.join(ROOT, ".gpu_deps")
# Run argv in a network namespace of its own, its loopback up (Open MPI's
# start-up looks for an interface; a machine without network still has lo).
LOOPBACK_UP = textwrap.dedent("""
    import fcntl, os, socket, struct, sys
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    flags = struct.unpack("16sh", fcntl.ioctl(s, 0x8913, struct.pack("16sh", b"lo", 0)))[1]
    fcntl.ioctl(s, 0x8914, struct.pack("16sh", b"lo", flags | 1))
    os.execvp(sys.argv[1], sys.argv[1:])
""")


def can_unshare():
    return shutil.which("unshare") and subprocess.run(["unshare", "-rn", "true"], capture_output=True).returncode == 0


OFFLINE = ["unshare", "-rn", sys.executable, "-c", LOOPBACK_UP] if can_unshare() else []


@pytest.fixture(scope="module")
def carried(tmp_path_factory):
    """(prefix, environment, CMake arguments) of .gpu_deps unpacked afresh."""
    assert os.path.isdir(GPU_DEPS), f"no {GPU_DEPS}: scripts/gpu_deps makes it"
    prefix = str(tmp_path_factory.mktemp("mpdeps"))
    extra, cmake = envmod.carried_deps(GPU_DEPS, prefix)
    env = dict(os.environ, OPAL_PREFIX=extra["OPAL_PREFIX"], LD_LIBRARY_PATH=extra["LD_LIBRARY_PATH"],
               PATH=f"{extra['PATH']}:/usr/bin:/bin")
    return prefix, env, cmake


def run(argv, env, **kwargs):
    r = subprocess.run(OFFLINE + argv, env=env, capture_output=True, text=True, **kwargs)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


def test_the_network_is_out_of_reach_in_these_checks():
    print("offline:", bool(OFFLINE))
    if OFFLINE:
        out = subprocess.run(OFFLINE + [sys.executable, "-c", "import socket; print(socket.if_nameindex())"],
                             capture_output=True, text=True, check=True).stdout
        assert out.strip() == "[(1, 'lo')]"


def test_mp_configures_against_the_carried_libraries_alone(carried, tmp_path):
    prefix, env, cmake = carried
    build = tmp_path / "build"
    run(["cmake", "-S", ROOT, "-B", str(build), "-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={shutil.which('ninja')}",
         f"-DCMAKE_C_COMPILER={shutil.which('cc')}", f"-DCMAKE_CXX_COMPILER={shutil.which('c++')}",
         "-DMP_CUDA=OFF", "-DMP_PYTHON=OFF", "-DCMAKE_FIND_USE_CMAKE_SYSTEM_PATH=OFF",
         "-DCMAKE_FIND_USE_SYSTEM_ENVIRONMENT_PATH=OFF"] + cmake, env)
    cache = dict(re.findall(r"^(\w+):[A-Z]+=(.*)$", (build / "CMakeCache.txt").read_text(), re.M))
    for key in ("MPI_CXX_COMPILER", "MPI_CXX_HEADER_DIR", "MPI_mpi_LIBRARY", "Protobuf_PROTOC_EXECUTABLE",
                "Protobuf_INCLUDE_DIR", "Protobuf_LIBRARY_RELEASE", "GTest_DIR", "CLI11_DIR", "nlohmann_json_DIR",
                "dnnl_DIR", "Gloo_DIR"):
        assert cache.get(key, "").startswith(prefix + "/"), f"{key} = {cache.get(key)}"


def test_the_carried_protoc_compiles_mps_protos(carried, tmp_path):
    prefix, env, _ = carried
    protos = sorted(f for f in os.listdir(os.path.join(ROOT, "proto")) if f.endswith(".proto"))
    run([f"{prefix}/usr/bin/protoc", f"--proto_path={ROOT}/proto", f"--cpp_out={tmp_path}"] + protos, env)
    assert sorted(f for f in os.listdir(tmp_path) if f.endswith(".pb.cc")) == [p[:-6] + ".pb.cc" for p in protos]


def test_a_program_built_with_the_carried_mpi_runs_on_2_ranks(carried, tmp_path):
    prefix, env, _ = carried
    (tmp_path / "hello.cc").write_text(textwrap.dedent("""
        #include <mpi.h>
        #include <fstream>
        #include <iostream>
        #include <string>
        int main(int argc, char** argv) {
          MPI_Init(&argc, &argv);
          int rank = 0, size = 0;
          MPI_Comm_rank(MPI_COMM_WORLD, &rank);
          MPI_Comm_size(MPI_COMM_WORLD, &size);
          int sum = 0;
          MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
          std::ifstream maps("/proc/self/maps");
          for (std::string line; std::getline(maps, line);)
            if (rank == 0 && line.find("libmpi.so") != std::string::npos) std::cout << line << "\\n";
          if (rank == 0) std::cout << "ranks " << size << " sum " << sum << "\\n";
          MPI_Finalize();
        }
    """))
    run([f"{prefix}/usr/bin/mpicxx.openmpi", str(tmp_path / "hello.cc"), "-o", str(tmp_path / "hello")], env)
    out = run([os.path.join(ROOT, "launch", "mprun"), "-np", "2", "--bind-to", "none", str(tmp_path / "hello")],
              dict(env, MP_MPIRUN=f"{prefix}/usr/bin/mpirun"), timeout=120)
    assert "ranks 2 sum 1" in out
    assert {line.split()[-1].startswith(prefix + "/") for line in out.splitlines() if "libmpi.so" in line} == {True}
