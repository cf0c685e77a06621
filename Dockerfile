# syntax=docker/dockerfile:1
# One image for every gpuplace component: `gpuplace controller | webhook | agent` (and the CLI, e.g.
# the `gpuplace agent --once --print` steps of `gpuplace preflight`). charts/gpuplace runs it.
# Without the `workflows` extra: printing the preflight Workflow is done where maps are written.
#
#   docker build -t ghcr.io/gpuplace/gpuplace:0.1.0 .
#
# BASE_IMAGE is any Debian-based image with python3 and its venv module on PATH and libstdc++6 (for
# grpcio, the agent's kubelet PodResources client); the published image
# uses python:3.12-slim-bookworm (Python 3.12). `make image` (hack/build-image.sh) builds this same
# file with buildah, without a Docker engine, on a base made from Debian's own packages by
# mmdebstrap (Debian 12's python3, Python 3.11), and writes a reproducible OCI archive.
ARG BASE_IMAGE=python:3.12-slim-bookworm

# Build: a virtual environment with gpuplace and its dependencies, compiled to bytecode.
FROM ${BASE_IMAGE} AS build
# Set by reproducible builds (hack/build-image.sh): bytecode then records source hashes, not times.
ARG SOURCE_DATE_EPOCH
# GitPython looks for a git executable when imported; the image has none (the chart's components do
# not read git: ArgoCD brings the maps), so only `gpuplace diff` or a controller git source would.
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    GIT_PYTHON_REFRESH=quiet \
    SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH}
RUN python3 -m venv /opt/gpuplace
WORKDIR /src
COPY pyproject.toml README.md ./
COPY placement ./placement
COPY kubeio ./kubeio
COPY controller ./controller
COPY webhook ./webhook
COPY agent ./agent
COPY gpuplace ./gpuplace
# A regular (not editable) install: the runtime stage copies only the environment, not /src. pip
# and setuptools leave with the build: the runtime has no installer and no build tool. A build
# behind a TLS-inspecting proxy passes its CA bundle as the secret `ca-certificates` (never stored
# in a layer).
RUN --mount=type=secret,id=ca-certificates,required=false \
    if [ -s /run/secrets/ca-certificates ]; then export PIP_CERT=/run/secrets/ca-certificates; fi \
 && /opt/gpuplace/bin/pip install --no-compile . \
 && /opt/gpuplace/bin/pip uninstall --yes --quiet pip setuptools \
 && rm -f /opt/gpuplace/bin/activate* \
 && /opt/gpuplace/bin/python -m compileall -q -j 0 --invalidation-mode checked-hash /opt/gpuplace/lib \
 && /opt/gpuplace/bin/gpuplace --help >/dev/null

# Runtime: the same base (the venv's interpreter path must exist), no build tools, non-root.
FROM ${BASE_IMAGE}
LABEL org.opencontainers.image.title="gpuplace" \
      org.opencontainers.image.description="Declarative GPU placement for Kubernetes" \
      org.opencontainers.image.source="https://github.com/gpuplace/gpuplace" \
      org.opencontainers.image.licenses="Apache-2.0"
# 65532 is the chart's runAsUser (the distroless "nonroot" id); no home, no shell login. Written
# directly: a minimal Debian base has no useradd.
RUN echo 'gpuplace:x:65532:' >> /etc/group \
 && echo 'gpuplace:x:65532:65532:gpuplace:/nonexistent:/usr/sbin/nologin' >> /etc/passwd
COPY --from=build /opt/gpuplace /opt/gpuplace
# The root filesystem is read-only in the chart: no bytecode writes at runtime, logs unbuffered.
ENV PATH=/opt/gpuplace/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    GIT_PYTHON_REFRESH=quiet
USER 65532:65532
ENTRYPOINT ["gpuplace"]
CMD ["--help"]
