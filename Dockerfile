# gpuremediate controller image. The runtime is the Python standard library only, so the
# image is the interpreter plus the package: nothing is pip-installed.
#   docker build -t gpuremediate:dev .
FROM python:3.11-slim

LABEL org.opencontainers.image.title="gpuremediate" \
      org.opencontainers.image.description="Kubernetes controller that keeps GPU nodes healthy" \
      org.opencontainers.image.licenses="Apache-2.0"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONPATH=/app

WORKDIR /app
COPY --chown=0:0 gpuremediate/ /app/gpuremediate/
# Byte-compile now: the root filesystem is read-only at run time.
RUN python -m compileall -q /app/gpuremediate

USER 65532:65532
ENTRYPOINT ["python", "-m", "gpuremediate"]
CMD ["--help"]
