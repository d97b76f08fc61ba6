# test_ptx (label slow, registered where nvcc is found): the tensor-core kernels as nvcc builds
# them for sm_90, the facts emulation cannot show. For each kernel, in the PTX of its file
# (`nvcc -ptx`): at least one mma.sync and one ldmatrix; in ptxas's report (`-Xptxas -v`): no
# spill stores or loads; and the instructions a variant exists for (the `needs` list below: the
# raw-tile instances of v5, v6 and the MLA decode, and the 16-bit GEMM, copy by cp.async; v6's
# converting int8 tiles hold the sub.f16x2 of the magic-number trick, its E4M3 ones the cvt to
# f16x2 of sm_89+). Prints each kernel's counts and registers, "N passed, M failed".
#
#   cmake -DNVCC=<nvcc> -DROOT=<source dir> -DOUT=<scratch dir> -P check_ptx.cmake
cmake_policy(SET CMP0054 NEW) # "mma" below is a string, not the variable of that name
if(NOT NVCC OR NOT ROOT OR NOT OUT)
  message(FATAL_ERROR "usage: cmake -DNVCC=<nvcc> -DROOT=<dir> -DOUT=<dir> -P check_ptx.cmake")
endif()
set(incs -I${ROOT}/cuda)
foreach(d IN ITEMS core model cache attention engine eval)
  list(APPEND incs -I${ROOT}/cuda/${d} -I${ROOT}/reference_cpu/${d})
endforeach()
foreach(d IN ITEMS memory serve)
  list(APPEND incs -I${ROOT}/reference_cpu/${d})
endforeach()
list(APPEND incs -I${ROOT}/include)
file(MAKE_DIRECTORY ${OUT})
set(passed 0)
set(failed 0)
# entry-name regex | an instruction its PTX must hold
set(needs "flash_kernel_v5ILi[01]ELi1E|cp.async")
list(APPEND needs "flash_kernel_v6ILi[0-9]+ELi[01]ELi4E|cp.async")
list(APPEND needs "flash_kernel_v6ILi[0-9]+ELi0ELi1E|sub.f16x2")
list(APPEND needs "flash_kernel_v6ILi[0-9]+ELi0ELi2E|cvt.rn.f16x2.e4m3x2")
list(APPEND needs "gemv_kernel_w16ILi[01]ELi1E|ld.global.nc.v4")
list(APPEND needs "mla_decode_kernelILi[01]ELi1E|cp.async")
list(APPEND needs "matmul_kernel_mma|cp.async")
# file | kernel name as it appears in the mangled symbol | mma: must hold mma.sync and ldmatrix
foreach(pair IN ITEMS "attention/kvcu_flash_mma.cu|flash_kernel_v5|mma"
                      "attention/kvcu_flash_v6.cu|flash_kernel_v6|mma"
                      "attention/kvcu_attention_mla.cu|mla_decode_kernel|mma"
                      "model/kvcu_ops_fast.cu|matmul_kernel_mma|mma"
                      "model/kvcu_ops_fast.cu|gemv_kernel_w16|-")
  string(REPLACE "|" ";" pair "${pair}")
  list(GET pair 0 src)
  list(GET pair 1 kernel)
  list(GET pair 2 kind)
  get_filename_component(base ${src} NAME_WE)
  set(rc1 0)
  set(rc2 0)
  if(NOT DEFINED report_${base}) # each file compiled once
    execute_process(COMMAND ${NVCC} -std=c++17 -arch=sm_90 -ptx ${incs} ${ROOT}/cuda/${src}
                            -o ${OUT}/${base}.ptx RESULT_VARIABLE rc1 ERROR_VARIABLE e1)
    execute_process(COMMAND ${NVCC} -std=c++17 -arch=sm_90 -cubin -Xptxas -v ${incs}
                            ${ROOT}/cuda/${src} -o ${OUT}/${base}.cubin
                    RESULT_VARIABLE rc2 ERROR_VARIABLE report_${base} OUTPUT_VARIABLE out2)
  endif()
  set(report "${report_${base}}")
  if(rc1 OR rc2)
    message("FAIL ${src}: nvcc failed: ${e1}${report}")
    math(EXPR failed "${failed} + 1")
    continue()
  endif()
  file(READ ${OUT}/${base}.ptx ptx)
  # the names of the kernel's entries; each entry's text runs to the next .entry
  string(REGEX MATCHALL "\\.entry [_A-Za-z0-9]*${kernel}[_A-Za-z0-9]*\\(" heads "${ptx}")
  list(LENGTH heads n_entries)
  if(n_entries EQUAL 0)
    message("FAIL ${src}: no entry ${kernel} in the PTX")
    math(EXPR failed "${failed} + 1")
  endif()
  foreach(head IN LISTS heads)
    string(FIND "${ptx}" "${head}" at)
    string(SUBSTRING "${ptx}" ${at} -1 entry)
    string(SUBSTRING "${entry}" 7 -1 after)
    string(FIND "${after}" ".entry " next)
    if(next GREATER -1)
      string(SUBSTRING "${after}" 0 ${next} entry)
    endif()
    string(REGEX MATCH "\\.entry ([_A-Za-z0-9]*)" name "${head}")
    set(name ${CMAKE_MATCH_1})
    string(REGEX MATCHALL "mma\\.sync" mma "${entry}")
    string(REGEX MATCHALL "ldmatrix" ldm "${entry}")
    list(LENGTH mma n_mma)
    list(LENGTH ldm n_ldm)
    # ptxas: "Compiling entry function '<name>'", then its stack/spill and register lines
    string(REGEX MATCH "entry function .${name}.[^\n]*\n[^\n]*\n[^\n]*\n[^\n]*" rep "${report}")
    string(REGEX MATCH "([0-9]+) bytes spill stores, ([0-9]+) bytes spill loads" sp "${rep}")
    set(st ${CMAKE_MATCH_1})
    set(ld ${CMAKE_MATCH_2})
    string(REGEX MATCH "Used ([0-9]+) registers" rg "${rep}")
    message("${name}: ${n_mma} mma.sync, ${n_ldm} ldmatrix, ${CMAKE_MATCH_1} registers, "
            "spills ${st}/${ld} bytes")
    set(needs_ok 1)
    foreach(need IN LISTS needs)
      string(REPLACE "|" ";" need "${need}")
      list(GET need 0 re)
      list(GET need 1 ins)
      if(name MATCHES "${re}")
        string(FIND "${entry}" "${ins}" has)
        if(has EQUAL -1)
          message("FAIL ${name}: needs ${ins}")
          set(needs_ok 0)
        endif()
      endif()
    endforeach()
    if(NOT kind STREQUAL "mma" AND n_mma EQUAL 0) # a SIMT kernel: its needs and no spills
      set(n_mma 1)
      set(n_ldm 1)
    endif()
    if(n_mma GREATER 0 AND n_ldm GREATER 0 AND needs_ok AND st STREQUAL "0" AND ld STREQUAL "0")
      math(EXPR passed "${passed} + 1")
    else()
      message("FAIL ${name}: needs mma.sync and ldmatrix (a tensor-core kernel), its listed "
              "instructions, and no spills")
      math(EXPR failed "${failed} + 1")
    endif()
  endforeach()
endforeach()
message("${passed} passed, ${failed} failed")
if(failed GREATER 0)
  message(FATAL_ERROR "test_ptx failed")
endif()
