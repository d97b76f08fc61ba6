# kvlab in a container: the build, the tests, the docs and the emulation build, no GPU needed.
#
#   docker build -t kvlab .
#   docker run --rm -it kvlab                      # a shell in /kvlab, built
#   docker run --rm kvlab ctest --test-dir build -j 2
#
# The packages come from tools/setup/install-deps.sh, the list CI installs. With a GPU, build
# FROM an image that has the CUDA toolkit (BASE=nvidia/cuda:12.6.3-devel-ubuntu24.04, say) and
# run with --gpus all: CMake finds nvcc and builds the CUDA library too.
ARG BASE=debian:bookworm
FROM ${BASE}
RUN apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q bash && \
    rm -rf /var/lib/apt/lists/*
COPY tools/setup/install-deps.sh /tmp/install-deps.sh
RUN /tmp/install-deps.sh && rm -rf /var/lib/apt/lists/*
WORKDIR /kvlab
COPY . /kvlab
RUN cmake -B build && cmake --build build -j 2
CMD ["bash"]
