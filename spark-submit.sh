#!/usr/bin/env bash
# Run a job or script with the project's Spark: ./spark-submit.sh jobs/demo.py [args...]
# Every argument goes to the venv's spark-submit (from pyspark), after the Delta Lake jars (fetched
# on first use into the venv's cache, see engine/spark/delta_jars.py) and Delta's SQL settings, and,
# when the job's store (--store, else MQ_STORE, else engine.toml's) is on S3, the S3A jars
# (hadoop-aws and the AWS SDK bundle, see engine/spark/object_store.py).
set -euo pipefail
# shellcheck source=bin/mq-env.sh
source "$(dirname "${BASH_SOURCE[0]}")/bin/mq-env.sh"

props=()
if [ -f "$MQ_ROOT/conf/spark-defaults.conf" ]; then
    props=(--properties-file "$MQ_ROOT/conf/spark-defaults.conf")
fi
export PYTHONPATH="$MQ_ROOT${PYTHONPATH:+:$PYTHONPATH}"
delta=()
while IFS= read -r arg; do
    [ -n "$arg" ] && delta+=("$arg")
done < <(cd "$MQ_ROOT" && "$MQ_VENV/bin/python" -c \
    'from engine.spark.object_store import print_spark_submit_args; print_spark_submit_args()' "$@")
# The JVM's stderr goes through a filter that drops the one line Spark's launcher always causes
# ("WARNING: Using incubator modules: jdk.incubator.vector", no JVM option mutes it), so a job's
# error stays one line; everything else passes, line by line (engine.spark.session.JVM_NOISE).
exec "$MQ_VENV/bin/spark-submit" ${props[@]+"${props[@]}"} ${delta[@]+"${delta[@]}"} "$@" \
    2> >(grep -v --line-buffered '^WARNING: Using incubator modules: ' >&2)
