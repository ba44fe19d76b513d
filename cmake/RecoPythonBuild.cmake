# pip install (scikit-build-core): what the op library is built with, decided from the installing
# interpreter's torch and this machine, printed, and written into the package (reco/_build_info.py,
# read by reco.build_info()).
#
#   RECO_PYTHON_CUDA  AUTO (default): the CUDA ops when that torch has CUDA and nvcc is found;
#                     ON: the CUDA ops or an error saying what is missing; OFF: the CPU ops only.
#                     pyproject.toml maps the environment variable RECO_CUDA onto it.
#   architectures     CMAKE_CUDA_ARCHITECTURES when given (CMake's notation: 90, 90-real, 90-virtual),
#                     else TORCH_CUDA_ARCH_LIST (variable or environment; torch's notation:
#                     "8.0;9.0+PTX"), else the GPUs that torch sees, else RECO_PYTHON_DEFAULT_ARCHS.
#
# LibTorch's own -gencode flags are replaced by these in adapters/torch/CMakeLists.txt.

set(RECO_PYTHON_CUDA AUTO CACHE STRING "pip install: build the CUDA ops (AUTO, ON, OFF)")
set_property(CACHE RECO_PYTHON_CUDA PROPERTY STRINGS AUTO ON OFF)
# SASS for Ampere (sm_80, also runs on sm_86 / sm_89), Hopper, Blackwell (sm_100, sm_120) and
# PTX of sm_120 for later GPUs: every GPU that nvcc 13 and PyTorch's CUDA 13 wheels support
# from compute capability 8.0 on.
set(RECO_PYTHON_DEFAULT_ARCHS "80-real;90-real;100-real;120" CACHE STRING
    "pip install: CUDA architectures when neither TORCH_CUDA_ARCH_LIST nor a GPU names them")

string(TOUPPER "${RECO_PYTHON_CUDA}" _reco_py_cuda)
if(NOT _reco_py_cuda MATCHES "^(AUTO|ON|OFF|1|0|TRUE|FALSE|YES|NO)$")
  message(FATAL_ERROR "reco: RECO_PYTHON_CUDA (environment RECO_CUDA) = '${RECO_PYTHON_CUDA}': expected AUTO, ON or OFF")
endif()
if(_reco_py_cuda MATCHES "^(1|TRUE|YES)$")
  set(_reco_py_cuda ON)
elseif(_reco_py_cuda MATCHES "^(0|FALSE|NO)$")
  set(_reco_py_cuda OFF)
endif()

# The installing torch: version, CUDA version ("" for a CPU build), C++ ABI, the GPUs it sees.
execute_process(
  COMMAND "${Python_EXECUTABLE}" -c
    "import torch\nprint(torch.__version__)\nprint(torch.version.cuda or '')\nprint(int(torch.compiled_with_cxx11_abi()))\ncaps = []\ntry:\n    if torch.version.cuda and torch.cuda.is_available():\n        caps = sorted({'%d%d' % torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})\nexcept Exception:\n    pass\nprint(';'.join(caps))"
  OUTPUT_VARIABLE _reco_py_torch RESULT_VARIABLE _reco_py_rc ERROR_VARIABLE _reco_py_err
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _reco_py_rc EQUAL 0)
  message(FATAL_ERROR "reco: `import torch` failed in ${Python_EXECUTABLE} (install torch first, and build without "
                      "isolation: pip install --no-build-isolation .):\n${_reco_py_err}")
endif()
string(REPLACE "\n" ";" _reco_py_torch "${_reco_py_torch}")
list(GET _reco_py_torch 0 RECO_BUILT_TORCH_VERSION)
list(GET _reco_py_torch 1 RECO_BUILT_TORCH_CUDA)
list(GET _reco_py_torch 2 RECO_BUILT_TORCH_CXX11_ABI)
list(LENGTH _reco_py_torch _reco_n)
set(_reco_visible_archs "")
if(_reco_n GREATER 3)
  list(GET _reco_py_torch 3 _reco_visible_archs)
  string(REPLACE "," ";" _reco_visible_archs "${_reco_visible_archs}")
endif()

if(_reco_py_cuda STREQUAL "OFF")
  set(_reco_py_cuda_on OFF)
  set(_reco_py_why "RECO_CUDA / RECO_PYTHON_CUDA = OFF")
elseif(RECO_BUILT_TORCH_CUDA STREQUAL "")
  set(_reco_py_cuda_on OFF)
  set(_reco_py_why "torch ${RECO_BUILT_TORCH_VERSION} has no CUDA")
elseif(NOT CMAKE_CUDA_COMPILER)
  set(_reco_py_cuda_on OFF)
  set(_reco_py_why "no nvcc found (put it on PATH or set CUDACXX)")
else()
  set(_reco_py_cuda_on ON)
  set(_reco_py_why "torch ${RECO_BUILT_TORCH_VERSION} has CUDA ${RECO_BUILT_TORCH_CUDA} and nvcc is ${CMAKE_CUDA_COMPILER}")
endif()
if(_reco_py_cuda STREQUAL "ON" AND NOT _reco_py_cuda_on)
  message(FATAL_ERROR "reco: the CUDA ops were asked for (RECO_CUDA=ON) but cannot be built: ${_reco_py_why}")
endif()
set(RECO_ENABLE_CUDA ${_reco_py_cuda_on} CACHE BOOL "Build the CUDA backend's tests and benchmarks with nvcc" FORCE)

# torch's notation ("8.6", "9.0+PTX", "9.0a") in CMake's: SASS only -> XY-real, +PTX -> XY.
function(reco_torch_arch_list_to_cmake out list)
  string(REPLACE " " ";" list "${list}")
  string(REPLACE "," ";" list "${list}")
  set(result "")
  foreach(arch IN LISTS list)
    if(arch STREQUAL "")
      continue()
    endif()
    if(NOT arch MATCHES "^([0-9]+)\\.([0-9])([af]?)(\\+PTX)?$")
      message(FATAL_ERROR "reco: TORCH_CUDA_ARCH_LIST entry '${arch}': expected a compute capability such as "
                          "8.0, 9.0a or 12.0+PTX")
    endif()
    set(code "${CMAKE_MATCH_1}${CMAKE_MATCH_2}${CMAKE_MATCH_3}")
    if(CMAKE_MATCH_4)
      list(APPEND result "${code}")
    else()
      list(APPEND result "${code}-real")
    endif()
  endforeach()
  if(NOT result)
    message(FATAL_ERROR "reco: TORCH_CUDA_ARCH_LIST is empty")
  endif()
  set(${out} "${result}" PARENT_SCOPE)
endfunction()

set(RECO_PYTHON_ARCHS_FROM "")
if(RECO_ENABLE_CUDA)
  if(DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(RECO_PYTHON_ARCHS_FROM "CMAKE_CUDA_ARCHITECTURES")
  elseif(DEFINED TORCH_CUDA_ARCH_LIST OR DEFINED ENV{TORCH_CUDA_ARCH_LIST})
    if(DEFINED TORCH_CUDA_ARCH_LIST)
      set(_reco_list "${TORCH_CUDA_ARCH_LIST}")
    else()
      set(_reco_list "$ENV{TORCH_CUDA_ARCH_LIST}")
    endif()
    reco_torch_arch_list_to_cmake(_reco_archs "${_reco_list}")
    set(CMAKE_CUDA_ARCHITECTURES "${_reco_archs}")
    set(RECO_PYTHON_ARCHS_FROM "TORCH_CUDA_ARCH_LIST=${_reco_list}")
  elseif(_reco_visible_archs)
    set(CMAKE_CUDA_ARCHITECTURES "${_reco_visible_archs}")
    set(RECO_PYTHON_ARCHS_FROM "the visible GPUs")
  else()
    set(CMAKE_CUDA_ARCHITECTURES "${RECO_PYTHON_DEFAULT_ARCHS}")
    set(RECO_PYTHON_ARCHS_FROM "the default list (no TORCH_CUDA_ARCH_LIST, no GPU visible)")
  endif()
endif()

if(RECO_ENABLE_CUDA)
  message(STATUS "reco (pip install): CUDA and CPU ops, against torch ${RECO_BUILT_TORCH_VERSION} (CUDA "
                 "${RECO_BUILT_TORCH_CUDA}): ${_reco_py_why}; CUDA architectures ${CMAKE_CUDA_ARCHITECTURES} "
                 "from ${RECO_PYTHON_ARCHS_FROM}")
else()
  message(STATUS "reco (pip install): CPU ops only, against torch ${RECO_BUILT_TORCH_VERSION}: ${_reco_py_why}")
endif()
