# limitflow: `limitflow run` (default) or the faust worker, with the sample files.
#   docker build -t limitflow .
#   docker run --rm limitflow limitflow rules check examples/rules.yaml
#   docker run --rm -v lf:/data limitflow limitflow replay --rules examples/rules.yaml \
#     --input examples/events.jsonl --output - --dead-letter - --store sqlite:////data/replay.db
# (/data is the writable volume; replay does not read LIMITFLOW_STORE, run does)
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
# only what the package needs first, so code edits do not reinstall dependencies
COPY pyproject.toml README.md ./
COPY limitflow ./limitflow
COPY streams ./streams
COPY handlers ./handlers
COPY schemas ./schemas
COPY stores ./stores
RUN pip install '.[faust]'
COPY examples ./examples
COPY benchmarks ./benchmarks

RUN useradd --system --uid 10001 --home-dir /data limitflow \
    && mkdir -p /data && chown limitflow /data
USER limitflow
VOLUME ["/data"]
ENV LIMITFLOW_STORE=sqlite:////data/limitflow.db

CMD ["limitflow", "run"]
