# syntax=docker/dockerfile:1
# mmhost, GPU image: CUDA runtime + cuDNN base, onnxruntime-gpu and nvidia-ml-py through the `gpu` extra, torch
# pinned (PyPI's Linux torch wheel is the CUDA build). One image for both roles; the command picks it.
# Build from the repository root:  docker build -f deploy/docker/gpu.Dockerfile -t mmhost:gpu .
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04

# ---- build: Python venv tooling only here ---------------------------------------------------------------------------
FROM ${CUDA_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/mmhost
WORKDIR /src
COPY pyproject.toml README.md ./
COPY ground ./ground
COPY catalog ./catalog
COPY mmhost ./mmhost
COPY hostd ./hostd
COPY router ./router
COPY protos ./protos
COPY storage_adapters ./storage_adapters
COPY sim ./sim
# torch pinned as in pyproject's `torch` extra; `gpu` = onnxruntime-gpu + nvidia-ml-py (never together with `cpu`).
RUN /opt/mmhost/bin/pip install torch==2.13.0 \
 && /opt/mmhost/bin/pip install ".[gpu,torch]" \
 && /opt/mmhost/bin/mmhost --help > /dev/null

# ---- runtime: same base, the interpreter (no venv/pip packages, no compilers) and the venv ---------------------------
FROM ${CUDA_IMAGE}
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 mmhost \
 && useradd --system --uid 10001 --gid mmhost --home-dir /home/mmhost --create-home mmhost \
 && mkdir -p /var/cache/mmhost && chown mmhost:mmhost /var/cache/mmhost
COPY --from=build /opt/mmhost /opt/mmhost
ENV PATH=/opt/mmhost/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    MMHOST_HOSTD_CACHE_DIR=/var/cache/mmhost \
    MMHOST_HOSTD_DEVICE=cuda \
    MMHOST_HOSTD_DATA_PORT=8102 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 10001:10001
WORKDIR /home/mmhost
# gRPC (v2 / Triton), the data link routers use (a fixed port a container can publish; TLS as on gRPC) and
# Prometheus
EXPOSE 8101 8102 9101
ENTRYPOINT ["mmhost"]
CMD ["hostd"]
