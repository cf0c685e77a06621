# syntax=docker/dockerfile:1
# One image for every gpuplace component: `gpuplace controller | webhook | agent` (and the CLI, e.g.
# the `gpuplace agent --once --print` steps of `gpuplace preflight`). charts/gpuplace runs it.
# Without the `workflows` extra: printing the preflight Workflow is done where maps are written.
#
#   docker build -t ghcr.io/gpuplace/gpuplace:0.1.0 .
ARG PYTHON_VERSION=3.12

# Build: a virtual environment with gpuplace and its dependencies, compiled to bytecode.
FROM python:${PYTHON_VERSION}-slim-bookworm AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/gpuplace
WORKDIR /src
COPY pyproject.toml README.md ./
COPY placement ./placement
COPY kubeio ./kubeio
COPY controller ./controller
COPY webhook ./webhook
COPY agent ./agent
COPY gpuplace ./gpuplace
# A regular (not editable) install: the runtime stage copies only the environment, not /src.
RUN /opt/gpuplace/bin/pip install --no-compile . \
 && /opt/gpuplace/bin/python -m compileall -q -j 0 /opt/gpuplace/lib \
 && /opt/gpuplace/bin/gpuplace --help >/dev/null

# Runtime: the same slim Python (the venv's interpreter path must exist), no build tools, non-root.
FROM python:${PYTHON_VERSION}-slim-bookworm
LABEL org.opencontainers.image.title="gpuplace" \
      org.opencontainers.image.description="Declarative GPU placement for Kubernetes" \
      org.opencontainers.image.source="https://github.com/gpuplace/gpuplace" \
      org.opencontainers.image.licenses="Apache-2.0"
# 65532 is the chart's runAsUser (the distroless "nonroot" id); no home, no shell login.
RUN groupadd --system --gid 65532 gpuplace \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin gpuplace
COPY --from=build /opt/gpuplace /opt/gpuplace
# The root filesystem is read-only in the chart: no bytecode writes at runtime, logs unbuffered.
ENV PATH=/opt/gpuplace/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
ENTRYPOINT ["gpuplace"]
CMD ["--help"]
