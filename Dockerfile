# lfm2-rank in a container: the CUDA backend (Hopper, sm_90a), Open MPI, h5pack, the launch
# scripts, the tools and the text front end, installed under /opt/lfm2-rank (docs/container.md).
#
#   docker build -t lfm2-rank --build-arg LFM2_COMMIT=$(git rev-parse --short=12 HEAD) .
#   docker run --gpus all --rm lfm2-rank                 # the shipped default, one rank per GPU
#
# Two stages: `build` compiles on the CUDA devel image (scripts/setup.sh installs the Debian/Ubuntu
# packages and fetches the CUTLASS headers, as on a workstation); the final stage is the CUDA
# runtime image with only what the programs load, plus a Python environment for the tools.
# Checked by tests/container/test_dockerfile.py (hadolint and the project's own rules).

ARG CUDA_VERSION=12.8.1
ARG UBUNTU_VERSION=24.04

FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu${UBUNTU_VERSION} AS build
ARG LFM2_COMMIT=unknown
ENV DEBIAN_FRONTEND=noninteractive
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-pip ca-certificates libnccl-dev libnccl2 \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . /src
# setup.sh: the build's packages and the CUTLASS headers; the text modules it also installs are
# not needed to build (LFM2_TEXT_MODULES=0 skips them: the final stage has its own environment).
RUN LFM2_TEXT_MODULES=0 scripts/setup.sh \
 && rm -rf /var/lib/apt/lists/*
RUN cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DLFM2_BUILD_TESTS=OFF -DLFM2_COMMIT="${LFM2_COMMIT}" \
 && cmake --build /build -j "$(nproc)" \
 && cmake --install /build --prefix /opt/lfm2-rank

FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu${UBUNTU_VERSION}
ENV DEBIAN_FRONTEND=noninteractive
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends openmpi-bin hdf5-tools libnccl2 python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/lfm2-rank /opt/lfm2-rank
# The tools' Python modules in their own environment (the system's Python is externally managed).
RUN python3 -m venv /opt/lfm2-rank/venv \
 && /opt/lfm2-rank/venv/bin/pip install --no-cache-dir -r /opt/lfm2-rank/share/lfm2-rank/tools/requirements-text.txt
ENV PATH=/opt/lfm2-rank/bin:/opt/lfm2-rank/venv/bin:${PATH}
RUN h5pack --version && lfm2-text --help >/dev/null
RUN useradd --create-home --shell /bin/bash --uid 10001 lfm2
USER 10001
WORKDIR /home/lfm2
CMD ["lfm2-local"]
