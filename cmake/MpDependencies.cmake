# Finds every dependency with CMake's own modules and sets the 0/1 switches
# that mp/config.h.in records (MP_WITH_CUDA, MP_WITH_NCCL, MP_WITH_CUDNN).

find_program(MP_CCACHE ccache)
if(MP_CCACHE)
  set(CMAKE_C_COMPILER_LAUNCHER "${MP_CCACHE}")
  set(CMAKE_CXX_COMPILER_LAUNCHER "${MP_CCACHE}")
  set(CMAKE_CUDA_COMPILER_LAUNCHER "${MP_CCACHE}")
endif()

find_package(Threads REQUIRED)
find_package(MPI REQUIRED COMPONENTS CXX)
# Gloo's TCP transport: the CPU data plane without mpirun (comm/gloo/).
find_package(Gloo REQUIRED CONFIG)
find_package(Protobuf REQUIRED)
find_package(GTest REQUIRED)
find_package(CLI11 REQUIRED)
# 3.9: ordered_json (metrics.jsonl keeps its key order).
find_package(nlohmann_json 3.9 REQUIRED)
# oneDNN 2.x (Debian libdnnl-dev): CPU GEMMs. Its package config needs OpenCL.
find_package(dnnl REQUIRED CONFIG)

# ---- CUDA -------------------------------------------------------------------
set(MP_WITH_CUDA 0)
set(MP_WITH_NCCL 0)
set(MP_WITH_CUDNN 0)
string(TOUPPER "${MP_CUDA}" _mp_cuda)
if(NOT _mp_cuda MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "MP_CUDA must be AUTO, ON or OFF, not '${MP_CUDA}'")
endif()
if(NOT _mp_cuda STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER)
    # nvcc is often installed but not on PATH; look in the standard location.
    find_program(_mp_nvcc nvcc HINTS ENV CUDA_HOME ENV CUDA_PATH
                 PATHS /usr/local/cuda/bin PATH_SUFFIXES bin)
    if(_mp_nvcc)
      set(CMAKE_CUDA_COMPILER "${_mp_nvcc}")
    endif()
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(MP_WITH_CUDA 1)
  elseif(_mp_cuda STREQUAL "ON")
    message(FATAL_ERROR "MP_CUDA=ON but no CUDA compiler (nvcc) was found")
  else()
    message(STATUS "mp: nvcc not found, building CPU only")
  endif()
endif()

if(MP_WITH_CUDA)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "")
    # sm_80 (A100) and sm_90 (H100); both with PTX so newer GPUs JIT.
    set(CMAKE_CUDA_ARCHITECTURES 80 90)
  endif()
  enable_language(CUDA)
  # CMake 3.25 predates nvcc's C++20 support (CUDA 12+); teach it the flag.
  if(CMAKE_CUDA_COMPILER_VERSION VERSION_LESS 12.0)
    message(FATAL_ERROR "mp needs CUDA 12 or newer for C++20, found ${CMAKE_CUDA_COMPILER_VERSION}")
  endif()
  if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
  endif()
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  find_package(CUDAToolkit REQUIRED)
  # cuBLASLt must exist for a CUDA build, but it is not linked: it costs about
  # 0.1-0.2 s and 200 MB of RSS to load, so the GEMM code opens it at run time
  # only when a GPU is present.
  if(NOT TARGET CUDA::cublasLt)
    message(FATAL_ERROR "CUDA is on but cuBLASLt was not found next to ${CUDAToolkit_LIBRARY_DIR}")
  endif()
  # NCCL has no CMake module; it is installed with the toolkit here, or
  # given by NCCL_HOME (e.g. pip's nvidia-nccl wheel, whose library is only
  # libnccl.so.2: scripts/gpu_check).
  find_path(MP_NCCL_INCLUDE_DIR nccl.h
            HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV NCCL_HOME PATH_SUFFIXES include)
  find_library(MP_NCCL_LIBRARY NAMES nccl libnccl.so.2
               HINTS ${CUDAToolkit_LIBRARY_DIR} "${CUDAToolkit_LIBRARY_ROOT}/lib" ENV NCCL_HOME
               PATH_SUFFIXES lib lib64)
  if(MP_NCCL_INCLUDE_DIR AND MP_NCCL_LIBRARY)
    set(MP_WITH_NCCL 1)
    add_library(mp_nccl INTERFACE)
    target_include_directories(mp_nccl SYSTEM INTERFACE "${MP_NCCL_INCLUDE_DIR}")
    target_link_libraries(mp_nccl INTERFACE "${MP_NCCL_LIBRARY}")
  else()
    message(WARNING "mp: CUDA is on but NCCL was not found; GPU collectives will be unavailable")
  endif()
  message(STATUS "mp: CUDA ${CUDAToolkit_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES}, NCCL ${MP_NCCL_LIBRARY}")
  include(MpCudnn)
endif()
