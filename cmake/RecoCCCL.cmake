# Finds CCCL (Thrust, CUB, libcu++), the headers under reco::cpu and reco::cuda, and provides the
# target CCCL::CCCL. reco's own configure includes this file, and so does the installed
# recoConfig.cmake. Nothing here needs a CUDA toolkit. The places tried, in order:
#   path     RECO_CCCL_ROOT (a CMake or environment variable) or CCCL_DIR: a CCCL install prefix,
#            its lib/cmake/cccl directory or the include directory holding thrust/, cub/, cuda/
#   (an installed reco first tries the CCCL it was built against)
#   toolkit  the CUDA toolkit's copy, <toolkit>/lib64/cmake/cccl; the toolkit is found from nvcc
#            (CMAKE_CUDA_COMPILER, PATH, CUDAToolkit_ROOT, CUDA_HOME, CUDA_PATH, /usr/local/cuda)
#   pip      the PyPI package nvidia-cuda-cccl (or nvidia-cuda-cccl-cu12) installed for the Python
#            interpreter that find_package(Python3) picks: an active virtual environment first,
#            Python3_EXECUTABLE to name another one
# RECO_CCCL_SOURCE = path, toolkit or pip tries only that place (default: auto, all of them).
# Sets RECO_CCCL_FOUND_WITH (path, recorded, toolkit or pip), RECO_CCCL_INCLUDE_DIR,
# RECO_CCCL_VERSION and RECO_CCCL_LOCATION (what an installed reco records). When nothing works,
# a fatal error lists the three ways to provide CCCL (from recoConfig.cmake: reco_FOUND is false
# with that message).
if(TARGET CCCL::CCCL)
  if(NOT RECO_CCCL_FOUND_WITH)
    set(RECO_CCCL_FOUND_WITH "existing CCCL::CCCL target")
  endif()
  return()
endif()

if(NOT RECO_CCCL_SOURCE)
  set(RECO_CCCL_SOURCE auto)
endif()
if(NOT RECO_CCCL_SOURCE MATCHES "^(auto|path|toolkit|pip)$")
  message(FATAL_ERROR "RECO_CCCL_SOURCE is '${RECO_CCCL_SOURCE}'; expected auto, path, toolkit or pip")
endif()
if(NOT RECO_CCCL_ROOT AND DEFINED ENV{RECO_CCCL_ROOT})
  set(RECO_CCCL_ROOT "$ENV{RECO_CCCL_ROOT}")
endif()

# _reco_cccl_resolve(<dir>): sets _reco_cccl_cfg (a usable CCCL package directory) or
# _reco_cccl_inc (a directory with the three libraries' headers) in the caller, from any of the
# shapes a CCCL location comes in.
function(_reco_cccl_resolve dir)
  set(cfg "")
  set(inc "")
  set(header_dirs "${dir}" "${dir}/include" "${dir}/include/cccl")
  foreach(c "${dir}" "${dir}/lib64/cmake/cccl" "${dir}/lib/cmake/cccl")
    if(EXISTS "${c}/cccl-config.cmake")
      # CCCL's package config expects its headers under <prefix>/include[/cccl], <prefix> being
      # three levels above it. The nvidia-cuda-cccl wheel keeps them elsewhere (nvidia/cu13/include
      # next to nvidia/cu13/cccl/lib/cmake), and its config fails there, so then only the headers
      # are used.
      foreach(i "${c}/../../../include" "${c}/../../../include/cccl")
        if(EXISTS "${i}/thrust/version.h" AND EXISTS "${i}/cub/version.cuh")
          set(cfg "${c}")
          set(inc "${i}")
        endif()
      endforeach()
      list(APPEND header_dirs "${c}/../../../../include/cccl" "${c}/../../../../include")
      break()
    endif()
  endforeach()
  if(NOT cfg)
    foreach(i IN LISTS header_dirs)
      if(EXISTS "${i}/thrust/version.h" AND EXISTS "${i}/cub/version.cuh" AND EXISTS "${i}/cuda/std/version")
        set(inc "${i}")
        break()
      endif()
    endforeach()
  endif()
  if(inc)
    get_filename_component(inc "${inc}" ABSOLUTE)
  endif()
  set(_reco_cccl_cfg "${cfg}" PARENT_SCOPE)
  set(_reco_cccl_inc "${inc}" PARENT_SCOPE)
endfunction()

# _reco_cccl_use(<dir> <how>): makes CCCL::CCCL from <dir> if it holds CCCL; appends why not to
# _reco_cccl_tried otherwise.
macro(_reco_cccl_use dir how)
  if(NOT TARGET CCCL::CCCL)
    _reco_cccl_resolve("${dir}")
    if(_reco_cccl_cfg)
      set(CCCL_DIR "${_reco_cccl_cfg}" CACHE PATH "Directory of CCCL's CMake package" FORCE)
      set(_RECO_CCCL_DIR_BY_RECO "${_reco_cccl_cfg}" CACHE INTERNAL "CCCL_DIR as reco set it")
      find_package(CCCL CONFIG QUIET)
    endif()
    if(NOT TARGET CCCL::CCCL AND _reco_cccl_inc)
      add_library(CCCL::CCCL INTERFACE IMPORTED GLOBAL)
      set_target_properties(CCCL::CCCL PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_reco_cccl_inc}")
    endif()
    if(TARGET CCCL::CCCL)
      set(RECO_CCCL_FOUND_WITH ${how})
      set(RECO_CCCL_INCLUDE_DIR "${_reco_cccl_inc}")
      set(RECO_CCCL_LOCATION "${_reco_cccl_cfg}")
      if(NOT _reco_cccl_cfg)
        set(RECO_CCCL_LOCATION "${_reco_cccl_inc}")
      endif()
    else()
      list(APPEND _reco_cccl_tried "${how}: no CCCL headers (thrust/, cub/, cuda/std/) at ${dir}")
    endif()
  endif()
endmacro()

set(_reco_cccl_tried)

# 1. A path the user gave.
if(RECO_CCCL_SOURCE MATCHES "^(auto|path)$")
  # (CCCL_DIR counts as given only when reco did not set it on an earlier run.)
  set(_reco_cccl_user_dir "${CCCL_DIR}")
  if(_reco_cccl_user_dir STREQUAL "${_RECO_CCCL_DIR_BY_RECO}" OR _reco_cccl_user_dir MATCHES "-NOTFOUND$")
    set(_reco_cccl_user_dir "")
  endif()
  foreach(_reco_cccl_dir IN ITEMS "${RECO_CCCL_ROOT}" "${_reco_cccl_user_dir}")
    if(_reco_cccl_dir)
      _reco_cccl_use("${_reco_cccl_dir}" path)
    endif()
  endforeach()
  if(RECO_CCCL_SOURCE STREQUAL "path" AND NOT RECO_CCCL_ROOT AND NOT _reco_cccl_user_dir)
    list(APPEND _reco_cccl_tried "path: neither RECO_CCCL_ROOT nor CCCL_DIR is set")
  endif()
endif()

# An installed reco: the CCCL it was built against, when it is still there.
if(RECO_CCCL_SOURCE STREQUAL "auto" AND _reco_cccl_recorded)
  _reco_cccl_use("${_reco_cccl_recorded}" recorded)
endif()

# 2. The CUDA toolkit.
if(RECO_CCCL_SOURCE MATCHES "^(auto|toolkit)$" AND NOT TARGET CCCL::CCCL)
  set(_reco_cccl_roots)
  if(CMAKE_CUDA_COMPILER)
    set(_reco_nvcc "${CMAKE_CUDA_COMPILER}")
  else()
    find_program(_reco_nvcc nvcc HINTS ENV CUDAToolkit_ROOT ENV CUDA_HOME ENV CUDA_PATH /usr/local/cuda
                 PATH_SUFFIXES bin)
  endif()
  if(_reco_nvcc)
    get_filename_component(_reco_cccl_root "${_reco_nvcc}" DIRECTORY)
    get_filename_component(_reco_cccl_root "${_reco_cccl_root}" DIRECTORY)
    list(APPEND _reco_cccl_roots "${_reco_cccl_root}")
  endif()
  foreach(_reco_cccl_var CUDAToolkit_ROOT CUDA_HOME CUDA_PATH)
    if(DEFINED ENV{${_reco_cccl_var}})
      list(APPEND _reco_cccl_roots "$ENV{${_reco_cccl_var}}")
    endif()
  endforeach()
  list(APPEND _reco_cccl_roots /usr/local/cuda)
  list(REMOVE_DUPLICATES _reco_cccl_roots)
  set(_reco_cccl_any_toolkit OFF)
  foreach(_reco_cccl_root IN LISTS _reco_cccl_roots)
    if(EXISTS "${_reco_cccl_root}" AND NOT TARGET CCCL::CCCL)
      set(_reco_cccl_any_toolkit ON)
      _reco_cccl_use("${_reco_cccl_root}" toolkit)
    endif()
  endforeach()
  if(NOT _reco_cccl_any_toolkit)
    list(APPEND _reco_cccl_tried "toolkit: no CUDA toolkit (no nvcc, CUDA_HOME, CUDA_PATH or /usr/local/cuda)")
  endif()
endif()

# 3. The nvidia-cuda-cccl package from PyPI, asked of Python: the directory above thrust/ among
# the package's files.
if(RECO_CCCL_SOURCE MATCHES "^(auto|pip)$" AND NOT TARGET CCCL::CCCL)
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Python3_EXECUTABLE)
    execute_process(
      COMMAND "${Python3_EXECUTABLE}" -c [=[
import importlib.metadata as md, pathlib, sys
for name in ("nvidia-cuda-cccl", "nvidia-cuda-cccl-cu12"):
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        continue
    for f in dist.files or ():
        if f.as_posix().endswith("thrust/version.h"):
            print(pathlib.Path(dist.locate_file(f)).resolve().parents[1])
            sys.exit(0)
sys.exit(1)
]=]
      RESULT_VARIABLE _reco_cccl_rc OUTPUT_VARIABLE _reco_cccl_py OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(_reco_cccl_rc EQUAL 0 AND _reco_cccl_py)
      _reco_cccl_use("${_reco_cccl_py}" pip)
    else()
      list(APPEND _reco_cccl_tried "pip: nvidia-cuda-cccl is not installed for ${Python3_EXECUTABLE}")
    endif()
  else()
    list(APPEND _reco_cccl_tried "pip: no Python 3 interpreter found")
  endif()
endif()

if(TARGET CCCL::CCCL)
  set(RECO_CCCL_VERSION "")
  if(EXISTS "${RECO_CCCL_INCLUDE_DIR}/cuda/std/__cccl/version.h")
    file(STRINGS "${RECO_CCCL_INCLUDE_DIR}/cuda/std/__cccl/version.h" _reco_cccl_line
         REGEX "^#define CCCL_VERSION [0-9]+")
    if(_reco_cccl_line MATCHES "([0-9]+)$")
      math(EXPR _reco_cccl_major "${CMAKE_MATCH_1} / 1000000")
      math(EXPR _reco_cccl_minor "(${CMAKE_MATCH_1} / 1000) % 1000")
      math(EXPR _reco_cccl_patch "${CMAKE_MATCH_1} % 1000")
      set(RECO_CCCL_VERSION "${_reco_cccl_major}.${_reco_cccl_minor}.${_reco_cccl_patch}")
    endif()
  endif()
  if(NOT reco_FIND_QUIETLY)
    message(STATUS "reco: CCCL ${RECO_CCCL_VERSION} (${RECO_CCCL_FOUND_WITH}): ${RECO_CCCL_INCLUDE_DIR}")
  endif()
else()
  list(JOIN _reco_cccl_tried "\n    " _reco_cccl_tried)
  set(_reco_cccl_error "reco needs CCCL (Thrust, CUB, libcu++), which was not found. Provide it one of three ways:
  1. a CUDA toolkit (nvcc on PATH, or CUDA_HOME / CUDAToolkit_ROOT, or /usr/local/cuda): its
     CCCL at <toolkit>/lib64/cmake/cccl is used;
  2. the PyPI package: python3 -m pip install nvidia-cuda-cccl, for the Python interpreter
     CMake finds (an active virtual environment first; -DPython3_EXECUTABLE=... names another);
  3. a path: -DRECO_CCCL_ROOT=<CCCL install prefix, its include directory or its lib/cmake/cccl>
     (or -DCCCL_DIR=<directory of cccl-config.cmake>).
  Tried (RECO_CCCL_SOURCE=${RECO_CCCL_SOURCE}):
    ${_reco_cccl_tried}")
  if(_reco_cccl_in_config)
    # From recoConfig.cmake: find_package(reco) fails with this message.
    set(reco_FOUND FALSE)
    set(reco_NOT_FOUND_MESSAGE "${_reco_cccl_error}")
  else()
    message(FATAL_ERROR "${_reco_cccl_error}")
  endif()
endif()
