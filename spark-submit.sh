#!/usr/bin/env bash
# Run a job or script with the project's Spark: ./spark-submit.sh jobs/demo.py [args...]
# Every argument goes to the venv's spark-submit (from pyspark); no JVM jars are downloaded.
set -euo pipefail
# shellcheck source=bin/mq-env.sh
source "$(dirname "${BASH_SOURCE[0]}")/bin/mq-env.sh"

props=()
if [ -f "$MQ_ROOT/conf/spark-defaults.conf" ]; then
    props=(--properties-file "$MQ_ROOT/conf/spark-defaults.conf")
fi
export PYTHONPATH="$MQ_ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec "$MQ_VENV/bin/spark-submit" ${props[@]+"${props[@]}"} "$@"
