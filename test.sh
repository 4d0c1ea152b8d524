#!/usr/bin/env bash
# Run the whole test suite (spark, slow and fault markers included): ./test.sh [pytest args...]
set -euo pipefail
# shellcheck source=bin/mq-env.sh
source "$(dirname "${BASH_SOURCE[0]}")/bin/mq-env.sh"
cd "$MQ_ROOT"
exec "$MQ_VENV/bin/python" -m pytest "$@"
