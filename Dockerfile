# nemori-dspy's REST API (serve http) on the core install + the serve and weaviate extras: no eval, optimize or
# local-model packages (no torch, no llama.cpp), so the chat model and the embedder are a provider's (litellm).
# UNTESTED: written on a machine without Docker; docs/serving.md ("Containers") says how it is meant to run.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
COPY pyproject.toml README.md LICENSE ./
COPY nemori_dspy ./nemori_dspy
COPY signatures ./signatures
COPY optimizers ./optimizers
COPY eval ./eval
RUN pip install ".[serve,weaviate]" && useradd --create-home --uid 1000 nemori && mkdir /data \
    && chown nemori /data
USER nemori

# SQLite by default (one replica: see docs/serving.md, "Scaling out"); compose switches to Weaviate.
ENV NEMORI_DB_PATH=/data/memory.sqlite3 \
    NEMORI_CACHE_DIR=/data/cache \
    NEMORI_EMBEDDER=openai/text-embedding-3-small \
    NEMORI_MODEL=openai/gpt-4o-mini
VOLUME /data
EXPOSE 8765
# A non-loopback bind needs NEMORI_API_TOKEN (the server refuses to start open on 0.0.0.0).
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8765/v1/health', timeout=4)"
CMD ["nemori-dspy", "serve", "http", "--host", "0.0.0.0", "--port", "8765"]
