# cmake --install: what another project needs to build against mp.
#   <prefix>/bin                 mp_worker, mp_prepare, mp_bench, the launch scripts
#   <prefix>/include/mp          mp.h (C++ API), mp_c.h (C ABI), and every header
#                                they reach, in the source tree's layout
#   <prefix>/lib                 the static libraries, libmp_c.so
#   <prefix>/lib/cmake/mp        mpConfig.cmake: find_package(mp) -> mp::runtime, mp::c
#   <prefix>/lib/pkgconfig/mp.pc the C ABI for pkg-config users
#   <prefix>/share/mp/configs    the shipped TrainConfigs
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(_mp_export_targets mp_proto mp_core mp_kernels mp_formats mp_comm mp_optim mp_models mp_runtime mp_api mp_c)
if(TARGET mp_nccl)
  list(APPEND _mp_export_targets mp_nccl)
endif()
install(TARGETS ${_mp_export_targets} EXPORT mpTargets
        ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}"
        LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}"
        RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}")
install(TARGETS mp_worker mp_prepare mp_bench RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}")
install(PROGRAMS launch/mprun launch/mp_node launch/mp_multinode launch/mp_elastic launch/mp.sbatch
        DESTINATION "${CMAKE_INSTALL_BINDIR}")

set(_mp_inc "${CMAKE_INSTALL_INCLUDEDIR}/mp")
install(DIRECTORY include/mp/ DESTINATION "${_mp_inc}" FILES_MATCHING PATTERN "*.h")
foreach(_dir core kernels formats comm optim models runtime)
  install(DIRECTORY "${_dir}/" DESTINATION "${_mp_inc}/${_dir}" FILES_MATCHING PATTERN "*.h")
endforeach()
install(FILES "${PROJECT_BINARY_DIR}/mp/config.h" DESTINATION "${_mp_inc}/mp")
install(FILES "${PROJECT_BINARY_DIR}/proto/mp.pb.h" "${PROJECT_BINARY_DIR}/proto/tensorboard.pb.h"
        DESTINATION "${_mp_inc}/proto")
install(DIRECTORY configs/ DESTINATION "${CMAKE_INSTALL_DATADIR}/mp/configs" FILES_MATCHING PATTERN "*.textproto")

install(EXPORT mpTargets NAMESPACE mp:: DESTINATION "${CMAKE_INSTALL_LIBDIR}/cmake/mp")
configure_package_config_file(cmake/mpConfig.cmake.in "${PROJECT_BINARY_DIR}/mpConfig.cmake"
                              INSTALL_DESTINATION "${CMAKE_INSTALL_LIBDIR}/cmake/mp")
write_basic_package_version_file("${PROJECT_BINARY_DIR}/mpConfigVersion.cmake" VERSION "${PROJECT_VERSION}"
                                 COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/mpConfig.cmake" "${PROJECT_BINARY_DIR}/mpConfigVersion.cmake"
        DESTINATION "${CMAKE_INSTALL_LIBDIR}/cmake/mp")

configure_file(cmake/mp.pc.in "${PROJECT_BINARY_DIR}/mp.pc" @ONLY)
install(FILES "${PROJECT_BINARY_DIR}/mp.pc" DESTINATION "${CMAKE_INSTALL_LIBDIR}/pkgconfig")
