# mp_ptxas_report(TARGET): each CUDA object of TARGET gets OBJECT.ptxas
# beside it, ptxas' resource report for every function and architecture
# (registers, stack frame, spill stores and loads), written by the compile
# that builds the object: nvcc --resource-usage prints it and
# cmake/ptxas_report.sh, the target's CUDA compiler launcher (in front of
# ccache when the build uses it), moves it out of the build log.
# tests/check_ptxas.py reads the reports (docs/testing.md, "Stack frames
# and spills").
function(mp_ptxas_report target)
  get_target_property(_launcher ${target} CUDA_COMPILER_LAUNCHER)
  if(NOT _launcher)
    set(_launcher "")
  endif()
  set_property(TARGET ${target} PROPERTY CUDA_COMPILER_LAUNCHER "${PROJECT_SOURCE_DIR}/cmake/ptxas_report.sh"
                                                                ${_launcher})
  target_compile_options(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CUDA>:--resource-usage>")
endfunction()
