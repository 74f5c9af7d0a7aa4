# brimful: slim runtime image, non-root.
#
#   docker build -t brimful .
#   docker run -p 8100:8100 -v hf-cache:/hf-cache:ro brimful \
#       serve --config /etc/brimful/brimful.toml --host 0.0.0.0 --port 8100 --upstream http://vllm:8000
#
# Two stages: the builder turns the source tree into a wheel; the runtime stage
# installs only that wheel and its runtime dependencies (no tests, no bench, no
# build tools, no source tree). Every runtime dependency ships manylinux wheels,
# so no compiler is needed in either stage.

FROM python:3.11-slim-bookworm AS builder

ENV PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY proxy ./proxy
COPY tokenizer_cache ./tokenizer_cache
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .


FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    # brimful reads tokenizers from $HF_HOME/hub/models--ORG--NAME/snapshots/*
    # (the cache vLLM fills); compose mounts that cache here, read-only.
    HF_HOME=/hf-cache

COPY --from=builder /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl \
    && rm -rf /wheels \
    && groupadd --system --gid 10001 brimful \
    && useradd --system --uid 10001 --gid brimful --no-create-home --shell /usr/sbin/nologin brimful \
    # The length log lives here; a named volume mounted on it inherits this owner.
    && mkdir -p /var/lib/brimful /hf-cache \
    && chown brimful:brimful /var/lib/brimful

COPY config/brimful.toml /etc/brimful/brimful.toml

USER brimful
WORKDIR /var/lib/brimful
EXPOSE 8100

# Liveness of brimful itself: /live is served by brimful (200 while its event loop
# runs); /health is relayed to vLLM and would mark brimful unhealthy whenever vLLM
# is (re)starting. GET /ready says whether the upstream answered and tokenizers loaded.
HEALTHCHECK --interval=15s --timeout=3s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8100/live', timeout=2).read()"]

ENTRYPOINT ["brimful"]
CMD ["serve", "--config", "/etc/brimful/brimful.toml", "--host", "0.0.0.0", "--port", "8100", "--upstream", "http://vllm:8000"]
