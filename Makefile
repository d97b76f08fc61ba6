# For llama2.c / llm.c habits: the CMake commands of the README behind four make targets.
# Everything is built out of the tree (build/, build-emu/); `make -n test` shows the commands.
#
#   make          build kvlab and the tests (CPU, and CUDA when nvcc is found)   -> build/
#   make test     the default test suite (ctest; the slow cases: make test-slow)
#   make tour     every chapter's demo on the embedded models
#   make emu      the CUDA kernels on CPU fibers, and the GPU tests on them       -> build-emu/
#   make docs     the Doxygen site and the figures                               -> build/docs/
#   make clean    remove build/ and build-emu/ (only those two: this Makefile made them)
JOBS ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: all test test-slow tour emu docs clean
all:
	cmake -B build
	cmake --build build -j $(JOBS)

test: all
	ctest --test-dir build --output-on-failure -j $(JOBS)

test-slow: all
	ctest --test-dir build --output-on-failure -C slow -L slow

tour: all
	./build/kvlab tour

emu:
	cmake --preset emulation
	cmake --build build-emu -j $(JOBS)
	ctest --test-dir build-emu --output-on-failure -j $(JOBS)

docs: all
	cmake --build build --target docs
	cmake --build build --target figures

clean:
	rm -rf build build-emu
