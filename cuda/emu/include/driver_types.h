/** @file driver_types.h
 * Emulation build: everything lives in cuda_runtime.h; this name exists because kernels and
 * host code may include it directly. */
#ifndef KVEMU_DRIVER_TYPES_H
#define KVEMU_DRIVER_TYPES_H
#include "cuda_runtime.h"
#endif
