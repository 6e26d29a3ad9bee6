# Run after a target's build (muster_forbid_includes in launcher/CMakeLists.txt):
# reads the compiler's dependency files of the target's objects (every header
# each source pulled in, however indirectly) and fails the build, removing the
# target's output so that the next build checks again, when one of them names
# a path matching FORBIDDEN.
#   -DOBJECTS_DIR=<the target's CMakeFiles/<target>.dir> -DFORBIDDEN=<regex>
#   -DTARGET=<name> -DOUTPUT=<the target's file> -DWHY=<what the rule is>
file(GLOB_RECURSE depfiles "${OBJECTS_DIR}/*.d")
if(NOT depfiles)
  # Ninja keeps the dependencies in its own log and removes the files: the
  # check is the Makefile builds' (scripts/build.sh, CI).
  message(STATUS "${TARGET}: no dependency files to check (a Ninja build)")
  return()
endif()
foreach(depfile ${depfiles})
  file(STRINGS "${depfile}" lines REGEX "${FORBIDDEN}")
  if(lines)
    list(GET lines 0 first)
    string(REGEX MATCH "[^ ]*${FORBIDDEN}[^ ]*" header "${first}")
    file(REMOVE "${OUTPUT}")
    get_filename_component(object "${depfile}" NAME_WE)
    message(FATAL_ERROR "${TARGET}: ${object} includes ${header}, which ${WHY}")
  endif()
endforeach()
