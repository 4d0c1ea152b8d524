#!/usr/bin/env bash
# Run the whole test suite (spark, slow and fault markers included): ./test.sh [pytest args...]
# Test files are spread over MQ_TEST_WORKERS pytest-xdist workers (default 2, one per core of the
# CI machine; 0 runs everything in this one process). A file's tests stay together on one worker,
# in order; each worker starts its own SparkSession, S3 server and Spark cluster when its tests
# need one.
set -euo pipefail
# shellcheck source=bin/mq-env.sh
source "$(dirname "${BASH_SOURCE[0]}")/bin/mq-env.sh"
cd "$MQ_ROOT"
workers="${MQ_TEST_WORKERS:-2}"
if [ "$workers" != "0" ]; then
    set -- -n "$workers" --dist loadfile "$@"
fi
exec "$MQ_VENV/bin/python" -m pytest "$@"
