# syntax=docker/dockerfile:1
# `eval-worker serve` on a GPU: claims checkpoint-evaluation jobs from the cache server and
# evaluates them. Build from the repository root (docker compose does):
#   docker build -f services/eval-worker.Dockerfile -t hidden-state-cache/eval-worker .
#
# Base: the official PyTorch runtime image, pinned. 2.7.1 sits inside the project's torch range
# (>=2.4,<2.14), its Python is 3.11 (the project's version), and CUDA 12.8 + cuDNN 9 cover Hopper
# (H100/H200) and Blackwell; the host needs the NVIDIA driver (R570+) and container toolkit.
# Taking torch from the image avoids a multi-GB CUDA wheel download on every dependency change.
# cache-server.Dockerfile shares every layer up to the last lines, so the second build is cached.
FROM pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime

ARG APP_UID=1000
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_OFFLINE=1

WORKDIR /src
# Dependencies first (their own layer, rebuilt only when pyproject.toml changes). The constraint
# keeps the image's CUDA torch: pip must never swap it for another build.
COPY pyproject.toml ./
RUN python -c "import torch; print(f'torch=={torch.__version__}')" > /tmp/keep-torch.txt \
 && python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/deps.txt \
 && pip install --constraint /tmp/keep-torch.txt --requirement /tmp/deps.txt \
 && rm /tmp/deps.txt
COPY cache_server ./cache_server
COPY eval_worker ./eval_worker
COPY schemas ./schemas
COPY README.md ./
RUN pip install --constraint /tmp/keep-torch.txt . \
 && cd / && rm -rf /src /tmp/keep-torch.txt

# A fixed non-root uid (APP_UID, default 1000) that must be able to write a bind-mounted store.
RUN if getent passwd "$APP_UID" >/dev/null; then userdel "$(getent passwd "$APP_UID" | cut -d: -f1)"; fi \
 && useradd --create-home --uid "$APP_UID" --shell /usr/sbin/nologin app \
 && mkdir -p /data/store /data/heads \
 && chown app:app /data/store /data/heads
USER app
WORKDIR /home/app

# No port: the worker only calls out to the cache server.
ENTRYPOINT ["eval-worker", "serve"]
