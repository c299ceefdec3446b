# One image for every evalq service: producer CLI, GPU and CPU workers, Flower.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    HF_HOME=/data/hf

# torch first and pinned, so no later requirement pulls another build; TORCH_SPEC selects a
# CUDA build for GPU hosts (e.g. --build-arg TORCH_SPEC="torch==2.13.0 --index-url ...").
ARG TORCH_SPEC="torch==2.13.0"
RUN pip install ${TORCH_SPEC}

WORKDIR /app
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY producer ./producer
COPY worker ./worker
RUN pip install . && useradd --create-home --uid 1000 evalq && mkdir -p /data && chown evalq /data
USER evalq

ENTRYPOINT ["evalq"]
CMD ["--help"]
