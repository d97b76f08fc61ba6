# kv_cuda_default_architectures(): CMAKE_CUDA_ARCHITECTURES when the command line gives none.
#
# kvlab runs on sm_75 (Turing: T4, RTX 20) and newer; CUDA 13 compiles for nothing older. A
# GPU visible at configure time (nvidia-smi answers) gets `native`: its own architecture only,
# the fastest build and the one a student's machine needs. Without one (CI, a login node) the
# build covers every generation kvlab tells apart, as machine code, plus PTX of the highest
# for cards newer than the list (the driver compiles it at load):
#
#   75   Turing          CUDA cores only (no mma.sync.m16n8k16 .f32 / bf16: the host routes
#                        every step to the CUDA-core kernels), 64 KiB shared memory per block
#   80   Ampere A100     tensor cores (mma.sync, cp.async), 163 KiB per block
#   86   Ampere RTX 30   tensor cores, 99 KiB per block (also runs sm_80 code; its own
#                        machine code is not built: see below)
#   89   Ada RTX 40/L4   tensor cores, fp8 conversions in hardware (cvt.e4m3x2), 99 KiB
#   90   Hopper H100     tensor cores, 227 KiB per block; PTX compute_90 for newer cards
#
# Every architecture is another pass of cicc and ptxas over cuda/. Measured on the heaviest file
# (attention/kvcu_decode_mma.cu, CPU seconds, nvcc 13.0): 80;90 (the former default) 37.5,
# 75;80;86;89;90 83.0 (2.2x: CI's nvcc build would double), 75;80;89;90 51.6 (1.4x). So the
# default leaves out 86 (an RTX 30 runs the sm_80 machine code: same major version) and keeps
# 89 for its fp8 conversions in hardware. CI's emulation build compiles no CUDA at all.
function(kv_cuda_default_architectures)
  if(DEFINED CMAKE_CUDA_ARCHITECTURES AND NOT CMAKE_CUDA_ARCHITECTURES STREQUAL "")
    message(STATUS "kvlab: CUDA architectures ${CMAKE_CUDA_ARCHITECTURES} (given)")
    return()
  endif()
  set(archs 75-real 80-real 89-real 90)
  find_program(KV_NVIDIA_SMI nvidia-smi)
  if(KV_NVIDIA_SMI)
    execute_process(COMMAND ${KV_NVIDIA_SMI} --query-gpu=compute_cap --format=csv,noheader
                    OUTPUT_VARIABLE caps RESULT_VARIABLE rc ERROR_QUIET
                    OUTPUT_STRIP_TRAILING_WHITESPACE TIMEOUT 20)
    if(rc EQUAL 0 AND caps MATCHES "^[0-9]+\\.[0-9]+")
      set(archs native)
    endif()
  endif()
  set(CMAKE_CUDA_ARCHITECTURES ${archs} CACHE STRING
      "CUDA architectures (kvlab's default: native with a GPU, else 75-real;80-real;89-real;90)")
  message(STATUS "kvlab: CUDA architectures ${archs} (default; -DCMAKE_CUDA_ARCHITECTURES=... to choose)")
endfunction()
