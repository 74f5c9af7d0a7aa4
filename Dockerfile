# headroom: slim runtime image, non-root.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY proxy ./proxy
COPY tokenizer_cache ./tokenizer_cache
COPY config ./config
RUN pip install --no-cache-dir . && useradd --system --uid 10001 headroom
USER headroom
EXPOSE 8100
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
  CMD python -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:8100/stats', timeout=2); sys.exit(0)"
ENTRYPOINT ["headroom"]
CMD ["serve", "--config", "/app/config/headroom.toml", "--host", "0.0.0.0", "--port", "8100", "--upstream", "http://vllm:8000"]
