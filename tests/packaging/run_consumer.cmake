# Builds and runs the consumer project against reco, either installed (MODE=install) or as a
# subdirectory (MODE=subdirectory). Fails on any step.
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
function(run)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGV}\n${out}\n${err}")
  endif()
endfunction()
if(MODE STREQUAL "install")
  run(${CMAKE_COMMAND} --install ${RECO_BUILD} --prefix ${WORK}/prefix)
  run(${CMAKE_COMMAND} -S ${CONSUMER} -B ${WORK}/build -G ${GENERATOR} -DCMAKE_PREFIX_PATH=${WORK}/prefix
      -DRECO_CONSUMER_MODE=find_package)
else()
  run(${CMAKE_COMMAND} -S ${CONSUMER} -B ${WORK}/build -G ${GENERATOR} -DRECO_CONSUMER_MODE=subdirectory
      -DRECO_SOURCE_DIR=${RECO_SOURCE})
endif()
run(${CMAKE_COMMAND} --build ${WORK}/build)
run(${WORK}/build/reco_consumer)
message(STATUS "consumer (${MODE}) built and ran")
