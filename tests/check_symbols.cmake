# test_symbols: every symbol the kvlab libraries export carries kv_, kvq_ or kvcu_ (the naming
# rule of docs/design.md), so a program linking them never meets a clash with its own names.
#
#   cmake -DNM=<nm> -DLIBS=<lib.a>[,<lib.a>...] -P check_symbols.cmake
#
# Counted: every global symbol a library defines (nm -g --defined-only, C++ names demangled
# and cut at their argument list). Not counted, by rule: CUDA kernels (<name>_kernel, numbered
# <name>_kernel_vN: docs/design.md names them so), weak symbols (inline functions of a header,
# defined again in every file that includes it), and the CUDA-runtime shim of the emulation
# build (cuda*, __*, kvemu*), which keeps NVIDIA's names on purpose. Prints each offender and
# "N passed, M failed"; fails when M > 0, or when a library cannot be read.
if(NOT NM OR NOT LIBS)
  message(FATAL_ERROR "usage: cmake -DNM=<nm> -DLIBS=<lib.a>[,...] -P check_symbols.cmake")
endif()
string(REPLACE "," ";" libs "${LIBS}")
set(passed 0)
set(failed 0)
foreach(lib IN LISTS libs)
  execute_process(COMMAND ${NM} -g --defined-only -C ${lib}
                  OUTPUT_VARIABLE out RESULT_VARIABLE rc ERROR_VARIABLE nm_err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${NM} ${lib}: ${nm_err}")
  endif()
  string(REPLACE ";" "," out "${out}")
  string(REPLACE "\n" ";" lines "${out}")
  set(n_lib 0)
  foreach(line IN LISTS lines)
    # "<address> <type> <name>[(<args>)]"; archive member headers and blank lines do not match
    if(NOT line MATCHES "^[0-9a-fA-F]* ([A-Za-z]) ([^(]+)")
      continue()
    endif()
    set(type "${CMAKE_MATCH_1}")
    string(STRIP "${CMAKE_MATCH_2}" name)
    if(type MATCHES "^[WVwv]$" OR name MATCHES "^(cuda|__|kvemu)" OR
       name MATCHES "_kernel(_v[0-9]+)?$")
      continue()
    endif()
    math(EXPR n_lib "${n_lib} + 1")
    if(name MATCHES "^(kv_|kvq_|kvcu_)")
      math(EXPR passed "${passed} + 1")
    else()
      math(EXPR failed "${failed} + 1")
      get_filename_component(base ${lib} NAME)
      message("FAIL ${base}: exported symbol without kv_/kvq_/kvcu_: ${name}")
    endif()
  endforeach()
  if(n_lib EQUAL 0)
    message(FATAL_ERROR "${lib}: no exported symbol found (is ${NM} the right nm?)")
  endif()
endforeach()
message("${passed} passed, ${failed} failed")
if(failed GREATER 0)
  message(FATAL_ERROR "exported symbols without the kvlab prefixes")
endif()
