# gpuremediate image: the controller (`run`, the default), the node agent (`python -m gpuremediate.agent`, the
# DaemonSet's command) and the CLI. The runtime is the Python standard library only, so the image is the
# interpreter plus the package: nothing is pip-installed.
#
#   docker build --build-arg VERSION=0.1.0 -t gpuremediate:0.1.0 .                   # the release base below
#   docker build --build-arg BASE=gpuremediate-base:bookworm --build-arg VERSION=0.1.0 .  # no registry: .ci/base-image.sh
#
# BASE: any image with Python >= 3.11 as python3 (and a POSIX shell for the RUN step). The release default is
# python:3.11.13-slim-bookworm pinned by digest; CI builds on a local Debian bookworm minbase + python3
# (debootstrap, .ci/base-image.sh), as no registry can be reached there. `make image` passes both arguments.
ARG BASE=python:3.11.13-slim-bookworm@sha256:86adf8dbadc3d6e82ee5dd2c74bec2e1c2467cdad47886280501df722372d2e1
FROM ${BASE}

# VERSION: gpuremediate.__version__, which `make image` and the release pass; the build stops on any other value,
# so the label and `gpuremediate version` agree. Left out, the image carries no version label.
ARG VERSION=
LABEL org.opencontainers.image.title="gpuremediate" \
      org.opencontainers.image.description="Kubernetes controller that keeps GPU nodes healthy" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/gpuremediate/gpuremediate" \
      org.opencontainers.image.version="${VERSION}"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONPATH=/app

WORKDIR /app
COPY --chown=0:0 gpuremediate/ /app/gpuremediate/
# `python` is what the manifests run (the agent's command): Debian's python3 package has only `python3`.
# Byte-compiled now: the root filesystem is read-only at run time.
RUN set -eu; \
    command -v python >/dev/null 2>&1 || ln -s "$(command -v python3)" /usr/local/bin/python; \
    python -c 'import sys; assert sys.version_info >= (3, 11), "gpuremediate needs Python >= 3.11: " + sys.version'; \
    python -m compileall -q /app/gpuremediate; \
    built=$(python -c 'import gpuremediate; print(gpuremediate.__version__)'); \
    if [ -n "$VERSION" ] && [ "$built" != "$VERSION" ]; then \
      echo "VERSION is '$VERSION' but gpuremediate.__version__ is '$built': build with --build-arg VERSION=$built" >&2; \
      exit 1; \
    fi

USER 65532:65532
ENTRYPOINT ["python", "-m", "gpuremediate"]
CMD ["--help"]
