# The operator image: kopf and the streamjobs core, without Spark or Java (the operator runs no stage).
# Build from the repository root:
#   docker build -f docker/operator.Dockerfile -t streamjobs/operator:0.1.0 .
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    HOME=/tmp

WORKDIR /app
COPY pyproject.toml README.md ./
COPY core core
COPY worker worker
COPY autoscaler autoscaler
COPY operator operator
COPY runtime runtime
# --no-deps skips PySpark (~400 MB); these are what the operator process (streamjobs.controller:
# streamjobs_operator + streamjobs_autoscaler + streamjobs_core) imports.
RUN pip install --no-deps . \
 && pip install "pydantic>=2.6,<3" "pyyaml>=6" "numpy>=1.26" "pandas>=2.2,<3" "pyarrow>=15" "redis>=6.0" \
      "msgpack>=1.0" "kopf>=1.37" "kubernetes>=29" "prometheus-client>=0.20" \
 && python -c "import streamjobs.controller"

RUN useradd --uid 10001 --user-group --no-create-home --home-dir /tmp streamjobs
USER 10001:10001

EXPOSE 8080
CMD ["kopf", "run", "--standalone", "--all-namespaces", "-m", "streamjobs.controller", \
     "--liveness=http://0.0.0.0:8080/healthz"]
