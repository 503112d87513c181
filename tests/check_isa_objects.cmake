# A test (tests/CMakeLists.txt): each per-ISA object of the fused update
# (kernels/cpu/update_<isa>.cc) and of the GPT loops (layer_loops_<isa>.cc)
# must define exactly one global symbol, its select function. Anything else
# (an out-of-line copy of a shared inline function compiled with AVX
# instructions) could be picked by the linker for callers on CPUs without
# them.
# Input: -DNM=<nm> -DOBJECTS=<;-list of mp_kernels' objects>.
set(checked 0)
foreach(obj IN LISTS OBJECTS)
  if(obj MATCHES "update_(scalar|baseline|avx2|avx512)\\.cc\\.o$")
    set(select "select_span_${CMAKE_MATCH_1}")
  elseif(obj MATCHES "layer_loops_(baseline|avx2|avx512)\\.cc\\.o$")
    set(select "select_layer_loops_${CMAKE_MATCH_1}")
  else()
    continue()
  endif()
  execute_process(COMMAND "${NM}" -g --defined-only -C "${obj}" OUTPUT_VARIABLE out RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "nm failed on ${obj}")
  endif()
  string(REGEX REPLACE "\n$" "" out "${out}")
  string(REPLACE "\n" ";" lines "${out}")
  # RTTI objects are data, the same in every object: clang's UBSan emits the
  # typeinfo of the function pointer types it checks calls through.
  list(FILTER lines EXCLUDE REGEX " typeinfo (name )?for ")
  foreach(line IN LISTS lines)
    if(NOT line MATCHES " mp::detail::${select}\\(")
      message(FATAL_ERROR "${obj} exports more than its select function: ${line}")
    endif()
  endforeach()
  list(LENGTH lines count)
  if(NOT count EQUAL 1)
    message(FATAL_ERROR "${obj}: expected one global symbol, found ${count}")
  endif()
  math(EXPR checked "${checked} + 1")
endforeach()
if(checked LESS 4)
  message(FATAL_ERROR "found ${checked} per-ISA objects in: ${OBJECTS}")
endif()
message(STATUS "${checked} per-ISA objects export only their select function")
