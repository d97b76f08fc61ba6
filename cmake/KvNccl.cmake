# NCCL for the tensor-parallel GPU ranks (chapter 10, cuda/engine/): optional, real CUDA builds
# only (the emulation has no NCCL). Looked for beside the CUDA toolkit (NVIDIA's toolkit images
# ship nccl.h and libnccl there), then in the system paths and $NCCL_HOME.
# Sets KV_HAVE_NCCL, KV_NCCL_INCLUDE_DIR, KV_NCCL_LIBRARY.
option(KV_NCCL "Build the NCCL tensor-parallel ranks (cuda/engine/kvcu_tp.cu) when NCCL is found" ON)
set(KV_HAVE_NCCL OFF)
if(NOT KV_NCCL)
  message(STATUS "kvlab: KV_NCCL=OFF: tensor-parallel GPU ranks (cuda/engine/kvcu_tp.cu) not built")
elseif(NOT KV_CUDA_MODE STREQUAL "cuda")
  message(STATUS "kvlab: NCCL ranks need a real CUDA build (mode ${KV_CUDA_MODE}): not built")
else()
  find_path(KV_NCCL_INCLUDE_DIR nccl.h
            HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV NCCL_HOME PATH_SUFFIXES include)
  find_library(KV_NCCL_LIBRARY nccl
               HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib
                     ${CUDAToolkit_TARGET_DIR}/lib ENV NCCL_HOME PATH_SUFFIXES lib lib64)
  if(KV_NCCL_INCLUDE_DIR AND KV_NCCL_LIBRARY)
    set(KV_HAVE_NCCL ON)
    message(STATUS "kvlab: NCCL found (${KV_NCCL_LIBRARY}): building the tensor-parallel GPU ranks")
  else()
    message(STATUS "kvlab: NCCL not found (nccl.h and libnccl; set NCCL_HOME to point at it): "
                   "tensor-parallel GPU ranks (cuda/engine/kvcu_tp.cu) not built")
  endif()
endif()
