# mp_project_options(target): flags for project code (not for generated code).

set(MP_WARNING_FLAGS -Wall -Wextra -Wundef -Wshadow -Wnon-virtual-dtor -Wcast-align)

if(MP_SANITIZE AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  # GCC's -Wmaybe-uninitialized gives false positives in libstdc++ (std::regex,
  # std::function) when sanitizers instrument optimized code.
  list(APPEND MP_WARNING_FLAGS -Wno-maybe-uninitialized)
endif()

if((MP_SANITIZE OR MP_SANITIZE_THREAD) AND CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  # At -O1 (below) clang leaves the `omp simd` update loops scalar and says
  # so (-Wpass-failed); sanitizer builds check behaviour, not speed.
  list(APPEND MP_WARNING_FLAGS -Wno-pass-failed)
endif()

# A sanitizer build with clang also builds the fuzz targets (tests/fuzz/)
# as libFuzzer binaries; the code they reach gets its coverage feedback
# from mp_fuzz_coverage(target).
set(MP_LIBFUZZER OFF)
if(MP_SANITIZE AND CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  set(MP_LIBFUZZER ON)
endif()
function(mp_fuzz_coverage target)
  if(MP_LIBFUZZER)
    target_compile_options(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link>")
  endif()
endfunction()

if(MP_SANITIZE)
  set(MP_SANITIZE_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=undefined
                        -fno-omit-frame-pointer)
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${MP_SANITIZE_FLAGS}>")
  add_link_options(${MP_SANITIZE_FLAGS})
  # Instrumented code at -O1 with line tables (-g1: every report still names
  # file and line) compiles in a third of the time of -O2 -g, and the hot
  # loops below stay at -O1 too: the update kernels took 61 s each at -O3.
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-O1;-g1>")
  set(MP_HOT_LOOP_OPT -O1)
elseif(MP_SANITIZE_THREAD)
  set(MP_SANITIZE_FLAGS -fsanitize=thread -fno-omit-frame-pointer)
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${MP_SANITIZE_FLAGS}>" "$<$<COMPILE_LANGUAGE:C,CXX>:-O1;-g1>")
  add_link_options(${MP_SANITIZE_FLAGS})
  set(MP_HOT_LOOP_OPT -O1)
else()
  # Element loops are the hot paths: -O3 vectorizes them (GCC's -O2 cost
  # model vectorizes only trivial loops). Placed after the build type's -O2.
  set(MP_HOT_LOOP_OPT -O3)
endif()

function(mp_project_options target)
  target_compile_options(${target} PRIVATE
    "$<$<COMPILE_LANGUAGE:CXX>:${MP_WARNING_FLAGS}>"
    # __FILE__ in error messages is repo-relative (core/tensor.cc:42), also
    # when another project builds mp as a subdirectory (python/CMakeLists.txt).
    "$<$<COMPILE_LANGUAGE:CXX>:-fmacro-prefix-map=${mp_SOURCE_DIR}/=>"
    # Math functions never set errno, so sqrtf and friends vectorize.
    "$<$<COMPILE_LANGUAGE:CXX>:-fno-math-errno>")
  if(MP_WERROR)
    target_compile_options(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:-Werror>")
  endif()
  if(MP_WITH_CUDA)
    string(JOIN "," _host_flags ${MP_WARNING_FLAGS} -fmacro-prefix-map=${mp_SOURCE_DIR}/=)
    target_compile_options(${target} PRIVATE
      "$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=${_host_flags}>"
      "$<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr>")
    if(MP_WERROR)
      target_compile_options(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CUDA>:--Werror=all-warnings>")
    endif()
  endif()
endfunction()
