# Install rules and the CMake package (find_package(reco); see recoConfig.cmake.in). One export
# set per component, so that each one's dependencies are looked for only when it is loaded:
#   recoTargets            reco::core, reco::cpu                     (always)
#   recoCudaTargets        reco::cuda                                (RECO_ENABLE_CUDA)
#   recoCudaAdapterTargets reco::cuda_adapter, reco::cuda_c          (RECO_ENABLE_CUDA)
#   recoTorchTargets       reco::torch, reco::torch_ops              (RECO_ENABLE_TORCH)
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(_reco_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/reco)
set(RECO_INSTALLED_COMPONENTS)

install(DIRECTORY include/reco DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS reco_core reco_cpu EXPORT recoTargets)
install(EXPORT recoTargets NAMESPACE reco:: DESTINATION ${_reco_cmake_dir})

if(RECO_ENABLE_CUDA)
  list(APPEND RECO_INSTALLED_COMPONENTS cuda)
  install(TARGETS reco_cuda EXPORT recoCudaTargets)
  install(EXPORT recoCudaTargets NAMESPACE reco:: DESTINATION ${_reco_cmake_dir})
endif()

# The installed shared libraries find the CUDA runtime (and LibTorch outside the system
# directories) where they were linked.
if(TARGET reco_cuda_adapter)
  list(APPEND RECO_INSTALLED_COMPONENTS cuda_adapter)
  set_target_properties(reco_cuda_adapter PROPERTIES EXPORT_NAME cuda_adapter)
  set_target_properties(reco_cuda_c PROPERTIES EXPORT_NAME cuda_c INSTALL_RPATH_USE_LINK_PATH ON)
  install(DIRECTORY adapters/cuda/include/reco DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  install(TARGETS reco_cuda_adapter reco_cuda_c EXPORT recoCudaAdapterTargets
          INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  install(EXPORT recoCudaAdapterTargets NAMESPACE reco:: DESTINATION ${_reco_cmake_dir})
endif()

if(TARGET reco_torch)
  list(APPEND RECO_INSTALLED_COMPONENTS torch)
  set_target_properties(reco_torch PROPERTIES EXPORT_NAME torch)
  set_target_properties(reco_torch_ops PROPERTIES EXPORT_NAME torch_ops INSTALL_RPATH_USE_LINK_PATH ON)
  install(DIRECTORY adapters/torch/include/reco DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  install(TARGETS reco_torch reco_torch_ops EXPORT recoTorchTargets
          INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  install(EXPORT recoTorchTargets NAMESPACE reco:: DESTINATION ${_reco_cmake_dir})
endif()

if(OpenMP_CXX_FOUND)
  set(RECO_WITH_OPENMP TRUE)
else()
  set(RECO_WITH_OPENMP FALSE)
endif()
set(RECO_CFG_TORCH_WITH_CUDA FALSE)
if(TARGET reco_torch AND RECO_TORCH_WITH_CUDA)
  set(RECO_CFG_TORCH_WITH_CUDA TRUE)
endif()
# Header-only unless an adapter library is installed.
set(_reco_arch_independent ARCH_INDEPENDENT)
if(TARGET reco_torch OR TARGET reco_cuda_adapter)
  set(_reco_arch_independent)
endif()
configure_package_config_file(${CMAKE_CURRENT_SOURCE_DIR}/cmake/recoConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/recoConfig.cmake INSTALL_DESTINATION ${_reco_cmake_dir})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/recoConfigVersion.cmake
  COMPATIBILITY SameMinorVersion ${_reco_arch_independent})
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/recoConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/recoConfigVersion.cmake
              ${CMAKE_CURRENT_SOURCE_DIR}/cmake/RecoCCCL.cmake ${CMAKE_CURRENT_SOURCE_DIR}/cmake/RecoTorchLibraries.cmake
  DESTINATION ${_reco_cmake_dir})
