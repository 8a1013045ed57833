# syntax=docker/dockerfile:1
# mmhost, CPU image: one image for both roles; the command picks it (`mmhost hostd` or `mmhost router`).
# Build from the repository root:  docker build -f deploy/docker/cpu.Dockerfile -t mmhost:cpu .
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- build: a virtual environment with mmhost and its CPU runtimes -------------------------------------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/mmhost
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
# torch first and pinned (as in pyproject's `torch` extra), from the CPU wheel index: PyPI's Linux torch is the
# multi-GB CUDA build. Then mmhost with the `cpu` extra (onnxruntime) and the `torch` extra (already satisfied).
RUN /opt/mmhost/bin/pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0 \
 && /opt/mmhost/bin/pip install ".[cpu,torch]" \
 && /opt/mmhost/bin/mmhost --help > /dev/null

# ---- runtime: the interpreter, the venv and HAProxy, nothing else (no pip install, no compilers) -------------------
FROM ${PYTHON_IMAGE}
# HAProxy: the router's fast lane (fast_lane=haproxy, docs/fast-lane.md); unused unless a router turns it on.
RUN apt-get update \
 && apt-get install -y --no-install-recommends haproxy \
 && rm -rf /var/lib/apt/lists/* \
 && haproxy -v > /dev/null \
 && groupadd --system --gid 10001 mmhost \
 && useradd --system --uid 10001 --gid mmhost --home-dir /home/mmhost --create-home mmhost \
 && mkdir -p /var/cache/mmhost && chown mmhost:mmhost /var/cache/mmhost
COPY --from=build /opt/mmhost /opt/mmhost
ENV PATH=/opt/mmhost/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    MMHOST_HOSTD_CACHE_DIR=/var/cache/mmhost \
    MMHOST_HOSTD_DATA_PORT=8102
USER 10001:10001
WORKDIR /home/mmhost
# gRPC (v2 / Triton), the data link routers use (a fixed port a container can publish; TLS as on gRPC) and
# Prometheus; the router's ports are set in the Kubernetes manifests.
EXPOSE 8101 8102 9101
ENTRYPOINT ["mmhost"]
CMD ["hostd"]
