# reco_torch_own_libraries(<folder of TorchConfig.cmake, or empty: search>): before
# find_package(Torch), names the LibTorch's own libc10 and libtorch. TorchConfig looks for them
# with find_library(... PATHS <its lib folder>), which searches the system folders first: beside
# Debian's libtorch-dev, a PyPI wheel's LibTorch would otherwise link Debian's libc10 and
# libtorch too, and a consumer given only Torch_DIR would load Debian's Caffe2 targets. Sets RECO_TORCH_ROOT (the LibTorch's prefix) in the caller's scope when found.
function(reco_torch_own_libraries torch_dir)
  find_file(_reco_torch_config TorchConfig.cmake PATHS ${torch_dir} ${Torch_DIR}
            PATH_SUFFIXES Torch share/cmake/Torch NO_CACHE)
  if(NOT _reco_torch_config)
    return()
  endif()
  get_filename_component(root "${_reco_torch_config}/../../../.." ABSOLUTE)
  foreach(lib c10 TORCH)
    string(TOLOWER ${lib} file)
    if(EXISTS "${root}/lib/lib${file}.so")
      set(${lib}_LIBRARY "${root}/lib/lib${file}.so" CACHE FILEPATH "LibTorch's lib${file}" FORCE)
    endif()
  endforeach()
  # Its Caffe2 config too (TorchConfig's find_dependency(Caffe2 PATHS ...) also searches the
  # system first when only Torch_DIR points at the wheel).
  if(EXISTS "${root}/share/cmake/Caffe2/Caffe2Config.cmake")
    set(Caffe2_DIR "${root}/share/cmake/Caffe2" CACHE PATH "LibTorch's Caffe2 config" FORCE)
  endif()
  set(RECO_TORCH_ROOT "${root}" PARENT_SCOPE)
endfunction()
