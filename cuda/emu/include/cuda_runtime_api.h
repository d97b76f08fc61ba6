/** @file cuda_runtime_api.h
 * Emulation build: everything lives in cuda_runtime.h; this name exists because kernels and
 * host code may include it directly. */
#ifndef KVEMU_CUDA_RUNTIME_API_H
#define KVEMU_CUDA_RUNTIME_API_H
#include "cuda_runtime.h"
#endif
