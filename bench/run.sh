#!/usr/bin/env bash
# The whole benchmark in one command: bash bench/run.sh [--quick] [other options of bench/run.py]
# Sources bin/mq-env.sh (virtualenv, Java 17, PYSPARK_PYTHON), then writes BENCHMARKS.md.
set -euo pipefail
# shellcheck source=bin/mq-env.sh
source "$(dirname "${BASH_SOURCE[0]}")/../bin/mq-env.sh"
cd "$MQ_ROOT"
export LAKEMQ_BENCH_COMMAND="bash bench/run.sh"
exec "$MQ_VENV/bin/python" bench/run.py "$@" </dev/null
