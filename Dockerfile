# GPU deployment image: one NInfer server on one CUDA GPU.
# Build:  docker build -t ninfer .
# Run:    docker run --gpus all -p 8080:8080 -v /models:/models ninfer \
#             model.artifact=/models/qwen3_6_27b.ninfer +preset=qwen27b_mtp
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    NINFER_CACHE_DIR=/var/cache/ninfer \
    NINFER_CONF_DIR=/opt/ninfer/conf

RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-pip curl \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/ninfer
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

COPY pyproject.toml README.md ./
COPY ninfer ./ninfer
COPY conf ./conf
COPY compile_cache ./compile_cache
# vllm-router: the router Deployment (ops/deploy/router.yaml) runs from this image too
RUN pip install torch && pip install ".[gpu]" "vllm-router>=0.1.17"

EXPOSE 8080
HEALTHCHECK --interval=30s --timeout=5s --start-period=600s --retries=3 \
  CMD curl -fsS http://127.0.0.1:8080/health || exit 1

ENTRYPOINT ["python3", "-m", "ninfer.service", "server.host=0.0.0.0", "server.port=8080"]
