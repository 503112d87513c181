# What every CTest registration shares: the launcher users run, the
# expectation script, and the sanitizer environment.
enable_testing()

set(MP_MPRUN "${PROJECT_SOURCE_DIR}/launch/mprun")
set(MP_EXPECT "${PROJECT_SOURCE_DIR}/tests/expect.sh")
set(MP_TEST_ENV "")
if(MP_SANITIZE)
  # Open MPI keeps allocations until exit (scripts/lsan.supp names them; the
  # slow unwinder lets the suppressions see Open MPI's caller frames).
  list(APPEND MP_TEST_ENV
       "ASAN_OPTIONS=allocator_may_return_null=1:detect_leaks=1:fast_unwind_on_malloc=0"
       "LSAN_OPTIONS=suppressions=${PROJECT_SOURCE_DIR}/scripts/lsan.supp:print_suppressions=0"
       "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
elseif(MP_SANITIZE_THREAD)
  # Races inside Open MPI and oneDNN (not built with TSan) are not ours:
  # their accesses are ignored, and scripts/tsan.supp names what remains.
  list(APPEND MP_TEST_ENV
       "TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1:allocator_may_return_null=1:suppressions=${PROJECT_SOURCE_DIR}/scripts/tsan.supp")
endif()
