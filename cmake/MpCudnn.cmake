# cuDNN's fused attention (kernels/cuda/attention_cudnn.cc), included by
# MpDependencies.cmake in CUDA builds. It needs
# - the cuDNN frontend's headers at the version scripts/cudnn_frontend pins,
#   in MP_CUDNN_FRONTEND_DIR (default .deps/cudnn-frontend-<version>, where
#   scripts/setup puts them; scripts/gpu_check passes .gpu_deps/'s copy);
# - cuDNN 9's headers: the toolkit's, or under CUDNN_HOME / CUDNN_PATH (e.g.
#   PyTorch's site-packages/nvidia/cudnn). The library is not linked: the
#   attention opens it at run time (by soname, then the file found here).
# With all of them MP_WITH_CUDNN is 1; when one is missing the configure log
# says which, and the build goes on without cuDNN attention (MP_WITH_CUDNN 0):
# the GPT then runs its own flash-attention kernels, as before.

set(MP_CUDNN_FRONTEND_VERSION 1.32.0)  # the version scripts/cudnn_frontend installs
set(MP_CUDNN_FRONTEND_DIR "${PROJECT_SOURCE_DIR}/.deps/cudnn-frontend-${MP_CUDNN_FRONTEND_VERSION}"
    CACHE PATH "The cuDNN frontend's folder (include/cudnn_frontend.h): scripts/cudnn_frontend installs it")
find_path(MP_CUDNN_INCLUDE_DIR cudnn_version.h HINTS ENV CUDNN_HOME ENV CUDNN_PATH ${CUDAToolkit_INCLUDE_DIRS}
          PATH_SUFFIXES include)
# A pip wheel's library is only libcudnn.so.9.
find_library(MP_CUDNN_LIBRARY NAMES cudnn libcudnn.so.9 NAMES_PER_DIR
             HINTS ENV CUDNN_HOME ENV CUDNN_PATH ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib lib64)

# _mp_header_version(FILE PREFIX OUT): "MAJOR.MINOR.PATCH" from FILE's
# `#define <PREFIX>MAJOR... N` lines (NAMES: the three macro names).
function(_mp_header_version file major minor patch out)
  file(STRINGS "${file}" _lines REGEX "^#define (${major}|${minor}|${patch}) +[0-9]+")
  set(_v "")
  foreach(_name ${major} ${minor} ${patch})
    string(REGEX MATCH "#define ${_name} +([0-9]+)" _m "${_lines}")
    list(APPEND _v "${CMAKE_MATCH_1}")
  endforeach()
  list(JOIN _v "." _v)
  set(${out} "${_v}" PARENT_SCOPE)
endfunction()

set(_mp_cudnn_missing "")
set(_mp_fe_header "${MP_CUDNN_FRONTEND_DIR}/include/cudnn_frontend_version.h")
if(NOT EXISTS "${_mp_fe_header}")
  set(_mp_cudnn_missing "no cuDNN frontend in MP_CUDNN_FRONTEND_DIR=${MP_CUDNN_FRONTEND_DIR} (scripts/cudnn_frontend installs it)")
else()
  _mp_header_version("${_mp_fe_header}" CUDNN_FRONTEND_MAJOR_VERSION CUDNN_FRONTEND_MINOR_VERSION
                     CUDNN_FRONTEND_PATCH_VERSION _mp_fe_version)
  if(NOT _mp_fe_version STREQUAL MP_CUDNN_FRONTEND_VERSION)
    set(_mp_cudnn_missing "the cuDNN frontend in ${MP_CUDNN_FRONTEND_DIR} is ${_mp_fe_version}, mp pins ${MP_CUDNN_FRONTEND_VERSION} (scripts/cudnn_frontend installs it)")
  endif()
endif()
if(NOT _mp_cudnn_missing)
  if(NOT MP_CUDNN_INCLUDE_DIR)
    set(_mp_cudnn_missing "no cuDNN headers (cudnn_version.h) in the toolkit or under CUDNN_HOME")
  else()
    _mp_header_version("${MP_CUDNN_INCLUDE_DIR}/cudnn_version.h" CUDNN_MAJOR CUDNN_MINOR CUDNN_PATCHLEVEL
                       MP_CUDNN_VERSION)
    if(NOT MP_CUDNN_VERSION MATCHES "^9\\.")
      set(_mp_cudnn_missing "cuDNN ${MP_CUDNN_VERSION} in ${MP_CUDNN_INCLUDE_DIR}: mp needs cuDNN 9")
    endif()
  endif()
endif()

if(_mp_cudnn_missing)
  message(WARNING "mp: building without cuDNN attention: ${_mp_cudnn_missing}")
else()
  set(MP_WITH_CUDNN 1)
  set(MP_CUDNN_FRONTEND_INCLUDE_DIR "${MP_CUDNN_FRONTEND_DIR}/include")
  if(NOT MP_CUDNN_LIBRARY)
    set(MP_CUDNN_LIBRARY "")  # only the soname is tried at run time
  endif()
  message(STATUS "mp: cuDNN ${MP_CUDNN_VERSION} (${MP_CUDNN_INCLUDE_DIR}, library ${MP_CUDNN_LIBRARY}), "
                 "cuDNN frontend ${_mp_fe_version}")
endif()
