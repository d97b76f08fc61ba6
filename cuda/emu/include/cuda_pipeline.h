/**
 * @file cuda_pipeline.h
 * The emulation build's cuda_pipeline.h: the primitives of cuda_pipeline_primitives.h.
 */
#ifndef KVEMU_CUDA_PIPELINE_H
#define KVEMU_CUDA_PIPELINE_H
#include "cuda_pipeline_primitives.h"
#endif
