#!/usr/bin/env bash
# Soak the whole broker for 20 minutes (or --minutes N): bash bench/soak.sh [options of bench/soak.py]
# Sources bin/mq-env.sh (virtualenv, Java 17, PYSPARK_PYTHON), then writes bench/results/soak.{json,md}.
set -euo pipefail
# shellcheck source=bin/mq-env.sh
source "$(dirname "${BASH_SOURCE[0]}")/../bin/mq-env.sh"
cd "$MQ_ROOT"
exec "$MQ_VENV/bin/python" bench/soak.py "$@" </dev/null
