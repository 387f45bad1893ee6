# The worker image: Python 3.11, Java 17 and PySpark 4, with the streamjobs packages installed.
# Build from the repository root:
#   docker build -f docker/worker.Dockerfile -t streamjobs/worker:0.1.0 .
# Jobs whose pyspark/stateful stages name functions (`module:function`) need those modules in the
# image: build FROM this one and COPY them onto the PYTHONPATH (/app/udfs is on it).
FROM python:3.11-slim-bookworm

RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
 && rm -rf /var/lib/apt/lists/*

ENV JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    # The root filesystem is read-only in the pods: Spark, Ivy and the JVM write under /tmp (an emptyDir).
    HOME=/tmp \
    SPARK_LOCAL_DIRS=/tmp \
    PYTHONPATH=/app/udfs \
    # Built into the image (the root filesystem is read-only in the pods): the JVM maps Spark's classes
    # from it and starts in about 60 % of the time (worker/streamjobs_worker/jvm_archive.py).
    STREAMJOBS_JVM_ARCHIVE=/app/spark-classes.jsa \
    # The worker's own JVM classes, compiled against this image's Spark (worker/streamjobs_worker/jvm_helpers.py).
    STREAMJOBS_JVM_HELPERS=/app/streamjobs-helpers.jar

WORKDIR /app
# Dependencies first, so a code change does not reinstall PySpark.
COPY pyproject.toml README.md ./
COPY core core
COPY worker worker
COPY autoscaler autoscaler
COPY operator operator
COPY runtime runtime
# javac only while the helpers compile: the image keeps the JRE.
RUN pip install . && mkdir -p /app/udfs \
 && apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends openjdk-17-jdk-headless \
 && python -m streamjobs_worker.jvm_helpers \
 && apt-get purge -y openjdk-17-jdk-headless && apt-get autoremove -y && rm -rf /var/lib/apt/lists/* \
 && python -m streamjobs_worker.jvm_archive

# Non-root, numeric (runAsNonRoot checks a numeric UID).
RUN useradd --uid 10001 --user-group --no-create-home --home-dir /tmp streamjobs
USER 10001:10001

EXPOSE 9100
ENTRYPOINT []
CMD ["python", "-m", "streamjobs_worker", "--help"]
