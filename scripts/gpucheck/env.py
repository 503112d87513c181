"""What the stages run in: the call's settings (read once from the
environment), the libraries a bare GPU machine lacks (from .gpu_deps), NCCL
and cuDNN (from the toolkit or PyTorch's wheels), the commit measured, the
machine, and the sources' mtimes kept for a build folder used again."""
import glob
import hashlib
import importlib.metadata
import os
import re
import shlex
import shutil
import subprocess

from . import plan


class Settings:
    """The call's settings, from the environment (docs/gpu.md names each)."""

    def __init__(self, root, environ):
        e = environ.get
        self.root = root
        self.build = os.path.abspath(os.path.join(root, e("MP_GPU_BUILD") or "build-gpu"))
        self.state = os.path.abspath(os.path.join(root, e("MP_GPU_CHECK_STATE") or
                                                  os.path.join(self.build, "gpu_check")))
        self.logs = os.path.join(self.state, "logs")
        self.out = os.path.abspath(e("OUT") or os.path.join(self.state, "out"))
        self.device = e("MP_GPU_CHECK_DEVICE") or "CUDA"
        self.deadline_s = int(e("MP_GPU_CHECK_DEADLINE_S") or 540)
        self.limits = plan.own_limits(e("MP_GPU_CHECK_STAGE_S") or "")
        self.ctests = e("MP_GPU_CHECK_CTESTS") or ""
        self.peak_tflops = float(e("MP_PEAK_TFLOPS") or 989)
        self.agree_steps = int(e("MP_GPU_CHECK_STEPS") or 100)
        self.test_jobs = int(e("MP_GPU_CHECK_TEST_JOBS") or 8)
        self.memcheck_jobs = int(e("MP_GPU_CHECK_MEMCHECK_JOBS") or 5)
        self.memcheck_test_s = int(e("MP_GPU_CHECK_MEMCHECK_TEST_S") or 150)
        self.gpt2_args = shlex.split(e("MP_GPU_CHECK_GPT2_ARGS") or "")
        self.gpt2_batches = [int(b) for b in (e("MP_GPU_CHECK_GPT2_BATCHES") or "4 16").split()]
        self.gpt2_steps = int(e("MP_GPU_CHECK_GPT2_STEPS") or 30)
        self.torch_args = shlex.split(e("MP_GPU_CHECK_TORCH_ARGS") or
                                      "--device cuda --seq 1024 --steps 10 --warmup 3 --clip 1.0")
        self.torch_modes = (e("MP_GPU_CHECK_TORCH_MODES") or "amp_bf16,amp_bf16_compile").split(",")
        self.compile_s = int(e("MP_GPU_CHECK_COMPILE_S") or 120)
        self.cudnn = e("MP_GPU_CHECK_CUDNN") or "auto"
        if self.cudnn not in ("auto", "toolkit", "wheel"):
            raise ValueError(f"MP_GPU_CHECK_CUDNN is auto, toolkit or wheel, not '{self.cudnn}'")

    @property
    def ctest_dir(self):
        return os.path.abspath(self.ctests) if self.ctests else self.build


# ---- the libraries ---------------------------------------------------------------

PREFIX = "/opt/mpdeps"  # where .gpu_deps is unpacked on a GPU machine (never into /)
MULTIARCH = "lib/x86_64-linux-gnu"


def carried_deps(gpu_deps, prefix):
    """The .deb files of `gpu_deps` (scripts/gpu_deps) unpacked into
    `prefix` (dpkg -x: no apt, no network), once. Returns (environment,
    CMake arguments) that build and run against them."""
    debs = sorted(glob.glob(os.path.join(gpu_deps, "*.deb")))
    if not debs:
        raise FileNotFoundError(f"no .deb files in {gpu_deps}")
    usr = os.path.join(prefix, "usr")
    stamp = os.path.join(prefix, ".unpacked")
    names = "\n".join(os.path.basename(d) for d in debs)
    if not os.path.exists(stamp) or open(stamp).read() != names:
        os.makedirs(prefix, exist_ok=True)
        for deb in debs:
            subprocess.run(["dpkg-deb", "-x", deb, prefix], check=True)
        mpirun = os.path.join(usr, "bin", "mpirun")  # what update-alternatives would make
        if not os.path.lexists(mpirun):
            os.symlink("orterun", mpirun)
        with open(stamp, "w") as f:
            f.write(names)
    env = {"OPAL_PREFIX": usr, "PATH": os.path.join(usr, "bin"), "LD_LIBRARY_PATH": os.path.join(usr, MULTIARCH) + ":" + os.path.join(usr, "lib")}  # libgloo: usr/lib
    cmake = [f"-DCMAKE_PREFIX_PATH={usr}", f"-DMPI_CXX_COMPILER={usr}/bin/mpicxx.openmpi",
             f"-DProtobuf_PROTOC_EXECUTABLE={usr}/bin/protoc"]
    return env, cmake


def wheel_libs(distribution_prefix, library):
    """(folder, version) of `library` (a file name start, e.g. libcudnn.so.)
    in the pip wheel whose distribution name starts with
    distribution_prefix (nvidia-cudnn-cu12, nvidia-cuda-nvrtc...), as this
    Python installed it; None when there is none."""
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if not name.startswith(distribution_prefix):
            continue
        for f in dist.files or []:
            if os.path.basename(str(f)).startswith(library):
                return os.path.dirname(os.path.abspath(str(dist.locate_file(f)))), dist.version
    return None


def prepend(env, key, *paths):
    parts = [p for p in paths if p] + ([env[key]] if env.get(key) else [])
    env[key] = ":".join(parts)


def stage_environment(s, environ):
    """The stages' environment and CMake arguments, and what the call
    records of its libraries: {"carried": ..., "nccl": ..., "cudnn": {...}}.
    Raises FileNotFoundError, saying what to do, when the machine lacks
    protoc, mpirun or oneDNN and no .gpu_deps is beside the checkout."""
    env = dict(environ)
    env.setdefault("NCCL_DEBUG", "WARN")
    env.pop("MP_CUDA_SYNC", None)  # only where a stage sets it
    env["MP_PEAK_TFLOPS"] = f"{s.peak_tflops:g}"  # mp_bench gemm_cuda's peak row names it
    cmake, libs = [], {}
    if s.device == "CUDA" and not (shutil.which("protoc") and shutil.which("mpirun")
                                   and os.path.exists("/usr/include/oneapi/dnnl/dnnl.hpp")):
        gpu_deps = os.path.join(s.root, ".gpu_deps")
        if not glob.glob(os.path.join(gpu_deps, "*.deb")):
            raise FileNotFoundError("this machine lacks protoc, mpirun or oneDNN and no .gpu_deps is beside the "
                                    "checkout: run scripts/gpu_deps where apt works and bring .gpu_deps along")
        extra, cmake = carried_deps(gpu_deps, PREFIX)
        env["OPAL_PREFIX"] = extra["OPAL_PREFIX"]
        prepend(env, "PATH", extra["PATH"])
        prepend(env, "LD_LIBRARY_PATH", extra["LD_LIBRARY_PATH"])
        libs["carried"] = PREFIX
    if s.device == "CUDA" and not glob.glob("/usr/local/cuda/lib*/libnccl.so*") and not env.get("NCCL_HOME"):
        nccl = wheel_libs("nvidia-nccl", "libnccl.so")
        if nccl:
            env["NCCL_HOME"] = os.path.dirname(nccl[0])
            prepend(env, "LD_LIBRARY_PATH", nccl[0])
            libs["nccl"] = f"{nccl[0]} (pip's wheel {nccl[1]})"
    libs["cudnn"] = cudnn_setup(s, env)
    frontend = os.path.join(s.root, ".gpu_deps", "cudnn-frontend")
    if os.path.exists(os.path.join(frontend, "include", "cudnn_frontend.h")):
        cmake.append(f"-DMP_CUDNN_FRONTEND_DIR={frontend}")
    env.setdefault("MP_MPIRUN", "mpirun")
    return env, cmake, libs


def cudnn_setup(s, env):
    """cuDNN from the toolkit or, where it has none (or MP_GPU_CHECK_CUDNN=
    wheel), from PyTorch's wheel: CUDNN_HOME for CMake, and the wheel's
    cuDNN and NVRTC folders on LD_LIBRARY_PATH (cuDNN compiles some of its
    attention engines at run time with NVRTC, of its own CUDA major
    version, which the toolkit may not have). What was chosen."""
    toolkit = os.path.exists("/usr/local/cuda/include/cudnn.h")
    if env.get("CUDNN_HOME"):
        return {"from": "CUDNN_HOME", "lib": env["CUDNN_HOME"]}
    if s.cudnn == "toolkit" or (s.cudnn == "auto" and toolkit):
        if not toolkit:
            return {"from": "nowhere: the toolkit has no cudnn.h"}
        return {"from": "the toolkit", "version": toolkit_cudnn_version(), "lib": "/usr/local/cuda"}
    cudnn = wheel_libs("nvidia-cudnn", "libcudnn.so")
    if not cudnn:
        return {"from": "nowhere: no cuDNN in the toolkit nor as pip's nvidia-cudnn wheel"}
    env["CUDNN_HOME"] = os.path.dirname(cudnn[0])
    nvrtc = wheel_libs("nvidia-cuda-nvrtc", "libnvrtc.so")
    nvrtc_dir = nvrtc_only(nvrtc[0], os.path.join(s.state, "nvrtc")) if nvrtc else None
    prepend(env, "LD_LIBRARY_PATH", cudnn[0], nvrtc_dir)
    row = {"from": "PyTorch's wheel", "version": cudnn[1], "lib": cudnn[0]}
    row["nvrtc"] = f"{nvrtc[0]} ({nvrtc[1]})" if nvrtc else "not in a wheel: the toolkit's, or none"
    return row


def nvrtc_only(folder, links):
    """A folder on the loader's path that holds NVRTC's libraries only:
    `folder` itself where that is all it holds (CUDA 12's wheel:
    nvidia/cuda_nvrtc/lib), else links to them in `links` (CUDA 13's wheels
    keep NVRTC in one folder with cuBLAS and the runtime, which must stay
    the toolkit's)."""
    names = os.listdir(folder)
    mine = [n for n in names if n.startswith("libnvrtc")]
    if len(mine) == len(names):
        return folder
    os.makedirs(links, exist_ok=True)
    for n in mine:
        link = os.path.join(links, n)
        if os.path.lexists(link):
            os.remove(link)
        os.symlink(os.path.join(folder, n), link)
    return links


def toolkit_cudnn_version(header="/usr/local/cuda/include/cudnn_version.h"):
    """MAJOR.MINOR.PATCHLEVEL of the toolkit's cuDNN headers (None if unread)."""
    try:
        with open(header) as f:
            found = dict(re.findall(r"#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) (\d+)", f.read()))
        return f"{found['MAJOR']}.{found['MINOR']}.{found['PATCHLEVEL']}"
    except (OSError, KeyError):
        return None


# ---- the commit and the machine -------------------------------------------------

def git_commit(root, environ):
    """The commit measured: MP_GPU_CHECK_COMMIT, else git (with -dirty when
    tracked files differ from it), else .gpu_deps/commit (scripts/gpu_deps
    writes it where git works, for a checkout copied without .git)."""
    if environ.get("MP_GPU_CHECK_COMMIT"):
        return environ["MP_GPU_CHECK_COMMIT"]
    try:
        return subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7", "--match", "NO_TAGS"],
                              cwd=root, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    try:
        with open(os.path.join(root, ".gpu_deps", "commit")) as f:
            return f.read().split()[0]
    except (OSError, IndexError):
        return "unknown"


def query(argv, timeout=20):
    """A short command's output (None when it could not run)."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout).stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def gpu_count():
    out = query(["nvidia-smi", "-L"]) or ""
    return sum(line.startswith("GPU") for line in out.splitlines())


def machine(device):
    """The GPU, its driver and the CUDA compiler."""
    info = {"host_cpus": os.cpu_count()}
    if device == "CUDA":
        gpu = query(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])
        nvcc = query([shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc", "--version"])
        info["gpu"] = gpu.splitlines()[0] if gpu else None
        info["nvcc"] = nvcc.splitlines()[-1] if nvcc else None
    return info


# ---- a build kept between calls ---------------------------------------------------

SKIP_DIRS = {"out", "__pycache__"}


def source_files(root):
    """Every file of the tree the build reads: all but the build folders,
    hidden folders (.git, .gpu_deps) and out/."""
    for top, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "build")) and d not in SKIP_DIRS)
        for name in sorted(files):
            yield os.path.relpath(os.path.join(top, name), root)


def file_hash(path):
    h = hashlib.sha1()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def save_mtimes(stamp, root):
    """After a build: each source's hash and mtime (ns)."""
    lines = [f"{file_hash(os.path.join(root, f))} {os.stat(os.path.join(root, f)).st_mtime_ns} {f}\n"
             for f in source_files(root)]
    with open(stamp, "w") as out:
        out.writelines(lines)
    return len(lines)


def restore_mtimes(stamp, root):
    """Before a build: the recorded mtime back on each source whose bytes are
    those of the last build, so that ninja, which compares mtimes, rebuilds
    only what changed even when the tree was copied afresh. The number of
    files whose mtime was put back."""
    if not os.path.exists(stamp):
        return 0
    restored = 0
    with open(stamp) as f:
        for line in f:
            digest, mtime, rel = line.rstrip("\n").split(" ", 2)
            path = os.path.join(root, rel)
            try:
                st = os.stat(path)
                if st.st_mtime_ns != int(mtime) and file_hash(path) == digest:
                    os.utime(path, ns=(st.st_atime_ns, int(mtime)))
                    restored += 1
            except OSError:
                continue
    return restored
