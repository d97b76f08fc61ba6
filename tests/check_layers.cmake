# test_layers: the layer rule of docs/design.md §3. reference_cpu/ and cuda/ are one folder per
# layer, from the bottom up core, model, cache, attention, memory, engine, serve, eval; a file
# may include the headers of its own folder and of the folders below it, never above.
#
#   cmake -DROOT=<source dir> -DLAYERS=core,model,... -P check_layers.cmake
#
# Counted: every #include "name" in reference_cpu/<layer>/ and cuda/<layer>/ that names a file
# of a layer folder. Not counted: system headers (<...>), cuda/kvcu.h (the public API over
# every layer, used by callers above the libraries) and cuda/emu/ (the emulator, no layer).
# Prints each offender and "N passed, M failed"; fails when M > 0.
if(NOT ROOT OR NOT LAYERS)
  message(FATAL_ERROR "usage: cmake -DROOT=<dir> -DLAYERS=<a,b,...> -P check_layers.cmake")
endif()
string(REPLACE "," ";" layers "${LAYERS}")
set(files)
set(index 0)
foreach(layer IN LISTS layers)
  foreach(lib reference_cpu cuda)
    file(GLOB here "${ROOT}/${lib}/${layer}/*")
    foreach(f IN LISTS here)
      get_filename_component(name "${f}" NAME)
      set("rank_${name}" ${index})
      list(APPEND files "${f}")
    endforeach()
  endforeach()
  math(EXPR index "${index} + 1")
endforeach()
set(passed 0)
set(failed 0)
foreach(f IN LISTS files)
  get_filename_component(name "${f}" NAME)
  set(mine "${rank_${name}}")
  file(STRINGS "${f}" includes REGEX "^[ \t]*#[ \t]*include[ \t]+\"[^\"]+\"")
  foreach(line IN LISTS includes)
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]+\"([^\"]+)\".*" "\\1" inc "${line}")
    get_filename_component(inc "${inc}" NAME)
    if(NOT DEFINED "rank_${inc}")
      continue()
    endif()
    if(${rank_${inc}} GREATER ${mine})
      list(GET layers ${mine} from)
      list(GET layers ${rank_${inc}} to)
      file(RELATIVE_PATH rel "${ROOT}" "${f}")
      message("${rel} (${from}) includes ${inc} (${to}): a lower layer reaches up")
      math(EXPR failed "${failed} + 1")
    else()
      math(EXPR passed "${passed} + 1")
    endif()
  endforeach()
endforeach()
message("${passed} passed, ${failed} failed")
if(failed GREATER 0)
  message(FATAL_ERROR "test_layers: ${failed} include(s) against the layer order")
endif()
