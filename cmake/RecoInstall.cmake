include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(DIRECTORY include/reco DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS reco_core reco_cpu reco_cuda EXPORT recoTargets)
install(EXPORT recoTargets NAMESPACE reco:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/reco)

configure_package_config_file(${CMAKE_CURRENT_SOURCE_DIR}/cmake/recoConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/recoConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/reco)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/recoConfigVersion.cmake
  COMPATIBILITY SameMinorVersion ARCH_INDEPENDENT)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/recoConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/recoConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/reco)
