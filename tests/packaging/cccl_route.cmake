# Configures reco (CPU only) with CCCL taken from one place, ROUTE = toolkit or pip, installs it
# and builds and runs the CPU consumer against the install, that consumer's find_package(reco)
# resolving CCCL the same way. ROUTE=pip first installs the PyPI package nvidia-cuda-cccl with
# pip into PIP_DIR (pip install --target; reused when already there) and also checks that
# RECO_CCCL_ROOT accepts the wheel's directories. ROUTE=none checks the error without CCCL.
# Prints "SKIPPED: ..." (ctest marks the test skipped) when the route cannot be tried here.
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
function(run)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGV}\n${out}\n${err}")
  endif()
  set(run_output "${out}${err}" PARENT_SCOPE)
endfunction()
function(expect_output regex what)
  if(NOT run_output MATCHES "${regex}")
    message(FATAL_ERROR "${what}: the output does not match '${regex}':\n${run_output}")
  endif()
endfunction()

# Only what the CPU package needs: no CUDA language check, no tests.
set(reco_args -G ${GENERATOR} -DCMAKE_CUDA_COMPILER=NOTFOUND -DRECO_ENABLE_CUDA=OFF -DRECO_ENABLE_TORCH=OFF
    -DRECO_BUILD_TESTS=OFF -DRECO_BUILD_BENCHMARKS=OFF -DRECO_BUILD_EXAMPLES=OFF -DRECO_INSTALL=ON)
set(env)

if(ROUTE STREQUAL "none")
  execute_process(COMMAND ${CMAKE_COMMAND} -S ${RECO_SOURCE} -B ${WORK}/reco ${reco_args} -DRECO_CCCL_SOURCE=path
                          -DRECO_CCCL_ROOT=${WORK}/no-such-dir
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(run_output "${out}${err}")
  if(rc EQUAL 0)
    message(FATAL_ERROR "configure without CCCL succeeded:\n${run_output}")
  endif()
  string(REGEX REPLACE "[ \n]+" " " run_output "${run_output}")
  foreach(piece "Provide it one of three ways" "1. a CUDA toolkit" "pip install nvidia-cuda-cccl"
                "-DRECO_CCCL_ROOT=" "no CCCL headers .* at ${WORK}/no-such-dir")
    expect_output("${piece}" "the error without CCCL")
  endforeach()
  message(STATUS "the configure without CCCL fails with the three ways listed")
  return()
elseif(ROUTE STREQUAL "toolkit")
  find_program(nvcc nvcc HINTS ENV CUDA_HOME ENV CUDA_PATH /usr/local/cuda PATH_SUFFIXES bin)
  if(NOT nvcc)
    message(STATUS "SKIPPED: no CUDA toolkit (nvcc) on this machine")
    return()
  endif()
  set(where "[^\n]*")
elseif(ROUTE STREQUAL "pip")
  if(NOT PYTHON)
    message(STATUS "SKIPPED: no Python 3 interpreter to run pip")
    return()
  endif()
  file(GLOB installed "${PIP_DIR}/nvidia_cuda_cccl-*.dist-info")
  if(NOT installed)
    execute_process(COMMAND ${PYTHON} -m pip install --no-deps --target ${PIP_DIR} --timeout 20 --retries 1
                            --disable-pip-version-check --no-input nvidia-cuda-cccl
                    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
    if(NOT rc EQUAL 0)
      message(STATUS "SKIPPED: pip could not install nvidia-cuda-cccl (no network, or no pip for ${PYTHON}):\n${out}\n${err}")
      return()
    endif()
  endif()
  get_filename_component(where "${PIP_DIR}" ABSOLUTE)
  set(where "${where}/[^\n]*")
  set(env PYTHONPATH=${PIP_DIR})
  list(APPEND reco_args -DPython3_EXECUTABLE=${PYTHON})
else()
  message(FATAL_ERROR "ROUTE is '${ROUTE}'")
endif()

run(${CMAKE_COMMAND} -E env ${env} ${CMAKE_COMMAND} -S ${RECO_SOURCE} -B ${WORK}/reco ${reco_args}
    -DRECO_CCCL_SOURCE=${ROUTE})
expect_output("reco: CCCL [0-9.]+ \\(${ROUTE}\\): ${where}" "reco's configure")
run(${CMAKE_COMMAND} --install ${WORK}/reco --prefix ${WORK}/prefix)

run(${CMAKE_COMMAND} -E env ${env} ${CMAKE_COMMAND} -S ${CONSUMER} -B ${WORK}/consumer -G ${GENERATOR}
    -DCMAKE_PREFIX_PATH=${WORK}/prefix -DRECO_CONSUMER_MODE=find_package -DRECO_CCCL_SOURCE=${ROUTE}
    -DPython3_EXECUTABLE=${PYTHON} ${LAUNCHER})
expect_output("reco: CCCL [0-9.]+ \\(${ROUTE}\\): ${where}" "the consumer's configure")
run(${CMAKE_COMMAND} --build ${WORK}/consumer)
run(${WORK}/consumer/reco_consumer)
message(STATUS "reco_consumer: ${run_output}")

if(ROUTE STREQUAL "pip")
  # RECO_CCCL_ROOT given the wheel's package directory: its CCCL config cannot find the headers
  # (they are not where it looks), so the headers next to it are used.
  file(GLOB_RECURSE config "${PIP_DIR}/nvidia/*/cccl-config.cmake")
  list(GET config 0 config)
  get_filename_component(config_dir "${config}" DIRECTORY)
  run(${CMAKE_COMMAND} -S ${RECO_SOURCE} -B ${WORK}/reco-path ${reco_args} -DRECO_CCCL_SOURCE=path
      -DRECO_CCCL_ROOT=${config_dir})
  expect_output("reco: CCCL [0-9.]+ \\(path\\): ${where}" "reco's configure with RECO_CCCL_ROOT")
endif()
message(STATUS "CCCL from ${ROUTE}: reco configured and installed, the consumer built and ran")
