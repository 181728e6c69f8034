# cachegate gateway image: `docker build -t cachegate .`
# One worker per container; scale with replicas sharing Redis (interfaces §5).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    CACHEGATE_HOST=0.0.0.0 \
    CACHEGATE_PORT=8080

WORKDIR /src
# Metadata first so the dependency layer is cached while only the code changes.
COPY pyproject.toml README.md ./
COPY gateway ./gateway
COPY policies ./policies
# The service and the simulated SGLang (compose's stand-in engines); not the load-test tools.
COPY backends ./backends
RUN pip install . && rm -rf /src

RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin cachegate
USER 10001
WORKDIR /home/cachegate

EXPOSE 8080
# The slim image has no curl: probe with the interpreter that is already there.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('CACHEGATE_PORT', '8080'), timeout=2)"]

ENTRYPOINT ["cachegate"]
CMD ["serve", "--config", "/etc/cachegate/config.yaml"]
