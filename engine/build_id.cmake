# Run at every build (cmake -P): writes OUT with the `git describe` of SRC,
# touching it only when the text changes, so a commit rebuilds quantize.cpp
# alone and a quantized model's lineage never names an older build.
execute_process(COMMAND git describe --always --dirty --tags
                WORKING_DIRECTORY ${SRC}
                OUTPUT_VARIABLE describe OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT describe)
  set(describe "unknown")
endif()
set(text "#define ATELIER_GIT_DESCRIBE \"${describe}\"\n")
if(EXISTS ${OUT})
  file(READ ${OUT} old)
endif()
if(NOT old STREQUAL text)
  file(WRITE ${OUT} "${text}")
endif()
