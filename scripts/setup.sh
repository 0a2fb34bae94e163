# Sourced by scripts/demo and scripts/test: installs what the project needs on a fresh Debian machine.
#   system packages (apt, when missing and running as root): redis-server, plus rabbitmq-server for tests
#   a virtualenv in .venv with the project and the extras given in EXTRAS
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${DELAY_BROKER_VENV:-$ROOT/.venv}"
OLDEST_VENV="${DELAY_BROKER_OLDEST_VENV:-$ROOT/.venv-oldest}"  # scripts/matrix: the oldest supported versions
PYTHON="${PYTHON:-python3}"

apt_install() {
    local missing=()
    for pair in "$@"; do
        local command="${pair%%:*}" package="${pair##*:}"
        command -v "$command" >/dev/null 2>&1 || [ -x "/usr/sbin/$command" ] || missing+=("$package")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "setup: installing ${missing[*]} with apt-get" >&2
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    else
        echo "setup: please install ${missing[*]} (Debian/Ubuntu: sudo apt-get install ${missing[*]})," \
             "then run this command again." >&2
        exit 1
    fi
}

ensure_venv() {
    # ensure_venv EXTRAS [CONSTRAINTS]: the project with EXTRAS in $VENV, pinned by a constraints file if given.
    local extras="$1" constraints="${2:-}"
    if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
        echo "setup: Python 3.10 or newer is needed as '$PYTHON' (set PYTHON=... to choose another)." >&2
        exit 1
    fi
    if [ ! -x "$VENV/bin/python" ]; then
        if ! "$PYTHON" -m venv "$VENV" >/dev/null 2>&1; then
            rm -rf "$VENV"
            if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
                apt-get update -qq
                DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
                "$PYTHON" -m venv "$VENV"
            else
                echo "setup: '$PYTHON -m venv' failed: install python3-venv, then run this again." >&2
                exit 1
            fi
        fi
    fi
    # Reinstall only when the dependencies or the requested extras change.
    local stamp="$VENV/.delay-broker-installed"
    local wanted
    wanted="$(cat "$ROOT/pyproject.toml" ${constraints:+"$constraints"} | sha256sum | cut -c1-16)-$extras"
    if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
        echo "setup: installing delay_broker[$extras] into $VENV" >&2
        "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
        "$VENV/bin/python" -m pip install -q ${constraints:+-c "$constraints"} -e "$ROOT[$extras]"
        echo "$wanted" > "$stamp"
    fi
}

run_together() {
    # run_together NAME COMMAND [NAME COMMAND ...]: the commands at once (each a bash -c string, its output in
    # a log printed when all have ended); fails if any failed. Interrupts are passed on (see _await_all).
    local names=() pids=() logs=() status=0 n
    while [ $# -ge 2 ]; do
        local log
        log="$(mktemp -t delay-broker-run-XXXXXX.log)"
        bash -c "$2" >"$log" 2>&1 &
        names+=("$1") pids+=($!) logs+=("$log")
        shift 2
    done
    _await_all "${pids[@]}" || true
    for n in "${!pids[@]}"; do
        echo "=== ${names[$n]} (exit ${_statuses[$n]})" >&2
        cat "${logs[$n]}"
        rm -f "${logs[$n]}"
        [ "${_statuses[$n]}" -eq 0 ] || status="${_statuses[$n]}"
    done
    return "$status"
}

run_forwarding() {
    # run_forwarding COMMAND [ARG ...]: COMMAND with its output as it comes, interrupts passed on (see _await_all).
    "$@" &
    _await_all $! || true
    return "${_statuses[0]}"
}

_await_all() {
    # _await_all PID ...: wait for each background job, its status in _statuses. A background job of a script
    # ignores SIGINT, and SIGTERM to this script would end it at once and leave the job running (a pytest and
    # its servers): both are passed on to the jobs as SIGTERM, which a pytest here unwinds like Ctrl-C.
    local pids=("$@") pid rc
    _statuses=()
    trap 'kill -TERM "${pids[@]}" 2>/dev/null || true' INT TERM
    for pid in "${pids[@]}"; do
        while true; do
            rc=0
            wait "$pid" || rc=$?
            kill -0 "$pid" 2>/dev/null || break  # ended: rc is its status (else a signal cut the wait short)
        done
        _statuses+=("$rc")
    done
    trap - INT TERM
}
