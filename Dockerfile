# limitflow: `limitflow run` (default) or the faust worker, with the sample files.
#   docker build -t limitflow .
#   docker run --rm limitflow limitflow rules check examples/rules.yaml
#   docker run --rm -v lf:/data limitflow limitflow replay --rules examples/rules.yaml \
#     --input examples/events.jsonl --output - --dead-letter - --store sqlite:////data/replay.db
# (/data is the writable volume; replay does not read LIMITFLOW_STORE, run does)
# The wheels are built in a stage with a C compiler (the compiled twins of the hot
# paths: the *.pyx files that setup.py lists); the image itself carries none.
FROM python:3.11-slim AS wheels
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY limitflow ./limitflow
COPY streams ./streams
COPY handlers ./handlers
COPY schemas ./schemas
COPY stores ./stores
RUN pip wheel --wheel-dir /wheels '.[faust]'

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY --from=wheels /wheels /wheels
RUN pip install --no-index --find-links /wheels 'limitflow[faust]' && rm -rf /wheels
COPY examples ./examples
COPY benchmarks ./benchmarks

RUN useradd --system --uid 10001 --home-dir /data limitflow \
    && mkdir -p /data && chown limitflow /data
USER limitflow
VOLUME ["/data"]
ENV LIMITFLOW_STORE=sqlite:////data/limitflow.db

CMD ["limitflow", "run"]
