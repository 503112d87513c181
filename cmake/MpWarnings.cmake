# mp_project_options(target): flags for project code (not for generated code).

set(MP_WARNING_FLAGS -Wall -Wextra -Wundef -Wshadow -Wnon-virtual-dtor -Wcast-align)

if(MP_SANITIZE)
  # GCC's -Wmaybe-uninitialized gives false positives in libstdc++ (std::regex,
  # std::function) when sanitizers instrument optimized code.
  list(APPEND MP_WARNING_FLAGS -Wno-maybe-uninitialized)
  set(MP_SANITIZE_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=undefined
                        -fno-omit-frame-pointer)
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${MP_SANITIZE_FLAGS}>")
  add_link_options(${MP_SANITIZE_FLAGS})
endif()

function(mp_project_options target)
  target_compile_options(${target} PRIVATE
    "$<$<COMPILE_LANGUAGE:CXX>:${MP_WARNING_FLAGS}>"
    # __FILE__ in error messages is repo-relative (runtime/tensor.cc:42).
    "$<$<COMPILE_LANGUAGE:CXX>:-fmacro-prefix-map=${CMAKE_SOURCE_DIR}/=>"
    # Math functions never set errno, so sqrtf and friends vectorize.
    "$<$<COMPILE_LANGUAGE:CXX>:-fno-math-errno>")
  if(MP_WERROR)
    target_compile_options(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:-Werror>")
  endif()
  if(MP_WITH_CUDA)
    string(JOIN "," _host_flags ${MP_WARNING_FLAGS} -fmacro-prefix-map=${CMAKE_SOURCE_DIR}/=)
    target_compile_options(${target} PRIVATE
      "$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=${_host_flags}>"
      "$<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr>")
    if(MP_WERROR)
      target_compile_options(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CUDA>:--Werror=all-warnings>")
    endif()
  endif()
endfunction()
