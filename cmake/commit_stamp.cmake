# Writes ${OUT} (the Lua module ember.build_stamp): the commit of Ember's own
# source tree at build time, so an installed ember whose source is gone still
# knows what it was built from. Run at every build; the file is rewritten only
# when the commit changes. "unknown" when SRC is not itself a git checkout (a
# copy without .git inside another repository must not report that repository).
#   cmake -DSRC=<source dir> -DOUT=<file> -P commit_stamp.cmake
set(commit "unknown")
find_program(GIT git)
if(GIT)
  execute_process(COMMAND ${GIT} -C ${SRC} rev-parse --show-toplevel
    OUTPUT_VARIABLE top OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
  file(REAL_PATH "${SRC}" src_real)
  if(rc EQUAL 0 AND top)
    file(REAL_PATH "${top}" top_real)
  endif()
  if(rc EQUAL 0 AND top_real STREQUAL src_real)
    execute_process(COMMAND ${GIT} -C ${SRC} rev-parse --short HEAD
      OUTPUT_VARIABLE head OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
    if(rc EQUAL 0 AND head)
      set(commit ${head})
      execute_process(COMMAND ${GIT} -C ${SRC} status --porcelain --untracked-files=no
        OUTPUT_VARIABLE dirty OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
      if(dirty)
        set(commit "${commit}+dirty")
      endif()
    endif()
  endif()
endif()
set(text "-- generated at build time by cmake/commit_stamp.cmake\nreturn { commit = \"${commit}\" }\n")
if(EXISTS ${OUT})
  file(READ ${OUT} old)
endif()
if(NOT old STREQUAL text)
  file(WRITE ${OUT} "${text}")
endif()
