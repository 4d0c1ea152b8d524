# shellcheck shell=bash
# Sourced by spark-submit.sh, test.sh and .ci/run; not meant to be run on its own.
#
# After sourcing: MQ_ROOT is the project root, MQ_VENV its virtualenv (created and installed with
# `pip install -e '.[dev]'` on first use, and again whenever pyproject.toml changes), and Spark's
# Python settings point at that virtualenv. Nothing here needs network access except the first
# install; the Delta Lake jars are fetched on first use by engine.spark (engine/spark/delta_jars.py)
# into the virtualenv's lakemq-jars/ cache.

MQ_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MQ_VENV="${MQ_VENV:-$MQ_ROOT/.venv}"
export MQ_ROOT MQ_VENV

_mq_java_major() {
    local java version
    if [ -n "${JAVA_HOME:-}" ] && [ -x "$JAVA_HOME/bin/java" ]; then
        java="$JAVA_HOME/bin/java"
    else
        java="$(command -v java 2>/dev/null)" || return 1
    fi
    # `java -version` prints e.g. `openjdk version "17.0.15" ...` (or "1.8.0_292" for Java 8) on stderr.
    version="$("$java" -version 2>&1 | sed -n 's/.*version "\([^"]*\)".*/\1/p' | head -n 1)"
    [ -n "$version" ] || return 1
    case "$version" in
        1.*) version="${version#1.}" ;;
    esac
    echo "${version%%[.+-]*}"
}

_mq_major="$(_mq_java_major || true)"
if [ -z "$_mq_major" ] || ! [ "$_mq_major" -ge 17 ] 2>/dev/null; then
    echo "lakemq needs Java 17: install it (e.g. apt-get install -y openjdk-17-jre-headless)" >&2
    exit 1
fi
unset _mq_major

_mq_stamp="$MQ_VENV/.lakemq-installed"
if [ ! -x "$MQ_VENV/bin/python" ] || [ ! -f "$_mq_stamp" ] || [ "$MQ_ROOT/pyproject.toml" -nt "$_mq_stamp" ]; then
    _mq_python="${MQ_PYTHON:-python3}"
    if ! "$_mq_python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
        echo "lakemq needs Python 3.11+ as '$_mq_python' (set MQ_PYTHON to another interpreter)" >&2
        exit 1
    fi
    echo "lakemq: setting up $MQ_VENV (pip install -e '.[dev]'; first use only) ..." >&2
    _mq_log="$(mktemp "${TMPDIR:-/tmp}/lakemq-install.XXXXXX")"
    if { [ -x "$MQ_VENV/bin/python" ] || "$_mq_python" -m venv "$MQ_VENV"; } >"$_mq_log" 2>&1 \
        && "$MQ_VENV/bin/python" -m pip install --disable-pip-version-check -q -e "$MQ_ROOT[dev]" >>"$_mq_log" 2>&1; then
        touch "$_mq_stamp"
        rm -f "$_mq_log"
    else
        echo "lakemq: installing the virtualenv failed; last lines of $_mq_log:" >&2
        tail -n 20 "$_mq_log" >&2
        exit 1
    fi
    unset _mq_python _mq_log
fi
unset _mq_stamp

export PYSPARK_PYTHON="$MQ_VENV/bin/python"
export PYSPARK_DRIVER_PYTHON="$MQ_VENV/bin/python"
# Spark reads conf/ (spark-defaults.conf, log4j2.properties) unless the caller points elsewhere.
export SPARK_CONF_DIR="${SPARK_CONF_DIR:-$MQ_ROOT/conf}"
