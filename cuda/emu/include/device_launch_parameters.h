/** @file device_launch_parameters.h
 * Emulation build: everything lives in cuda_runtime.h; this name exists because kernels and
 * host code may include it directly. */
#ifndef KVEMU_DEVICE_LAUNCH_PARAMETERS_H
#define KVEMU_DEVICE_LAUNCH_PARAMETERS_H
#include "cuda_runtime.h"
#endif
