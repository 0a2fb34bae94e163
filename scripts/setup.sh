# Sourced by scripts/demo and scripts/test: installs what the project needs on a fresh Debian machine.
#   system packages (apt, when missing and running as root): redis-server, plus rabbitmq-server for tests
#   a virtualenv in .venv with the project and the extras given in EXTRAS
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${DELAY_BROKER_VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
# The supported Pythons' ends (pyproject.toml: requires-python and classifiers). scripts/matrix runs the unit
# suite on both beside the main one: the oldest with the oldest dependencies (ci/oldest.txt), the newest with
# the current ones.
OLDEST_PYTHON_VERSION="3.10"
NEWEST_PYTHON_VERSION="3.13"
OLDEST_VENV="${DELAY_BROKER_OLDEST_VENV:-$ROOT/.venv-oldest}"
NEWEST_VENV="${DELAY_BROKER_NEWEST_VENV:-$ROOT/.venv-newest}"

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

find_python() {
    # find_python X.Y: prints the path of a Python X.Y: $PYTHON_X_Y if set, else pythonX.Y on the PATH, else
    # one of pyenv's versions. Fails saying what is missing and how to get it.
    local version="$1" override candidate
    override="PYTHON_${version//./_}"
    local candidates=("python$version")
    if [ -n "${!override:-}" ]; then
        candidates=("${!override}")  # named: that one or none
    else
        for candidate in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$version".*/bin/"python$version" \
            /root/.pyenv/versions/"$version".*/bin/"python$version" "/usr/bin/python$version" \
            "/usr/local/bin/python$version"; do
            candidates+=("$candidate")
        done
    fi
    for candidate in "${candidates[@]}"; do
        [ -n "$candidate" ] || continue
        candidate="$(command -v "$candidate" 2>/dev/null)" || continue
        if "$candidate" -c "import sys; sys.exit(sys.version_info[:2] != tuple(map(int, '$version'.split('.'))))" \
            2>/dev/null; then
            echo "$candidate"
            return 0
        fi
    done
    echo "setup: Python $version is needed (the project tests the oldest and newest Pythons it supports) and none" \
         "was found: ${!override:+$override=${!override} is not one, }not python$version on the PATH, nor in pyenv's" \
         "versions (${PYENV_ROOT:-$HOME/.pyenv}/versions)." \
         "Install it (pyenv install $version, or your distribution's python$version package with its venv module)" \
         "or name one with $override=/path/to/python$version." >&2
    return 1
}

ensure_venv() {
    # ensure_venv EXTRAS [CONSTRAINTS]: the project with EXTRAS in $VENV, on $PYTHON, pinned by a constraints file
    # if given. Installs with uv (into the venv first, from PyPI): a fresh venv takes seconds, not minutes.
    local extras="$1" constraints="${2:-}" version
    if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
        echo "setup: Python 3.10 or newer is needed as '$PYTHON' (set PYTHON=... to choose another)." >&2
        exit 1
    fi
    version="$("$PYTHON" -c 'import sys; print(sys.version.split()[0])')"
    if [ -x "$VENV/bin/python" ] && [ "$("$VENV/bin/python" -c 'import sys; print(sys.version.split()[0])' 2>/dev/null)" != "$version" ]; then
        echo "setup: $VENV is not on Python $version: making it anew" >&2
        rm -rf "$VENV"
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
    # Reinstall only when the dependencies, the requested extras or the Python change.
    local stamp="$VENV/.delay-broker-installed"
    local wanted
    wanted="$(cat "$ROOT/pyproject.toml" ${constraints:+"$constraints"} | sha256sum | cut -c1-16)-$extras-$version"
    if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
        echo "setup: installing delay_broker[$extras] into $VENV (Python $version)" >&2
        # pip's own warnings (an index this machine's pip.conf names but lacks ...) only when it fails.
        if ! "$VENV/bin/python" -m pip install -q uv >"$VENV/.pip-uv.log" 2>&1; then
            cat "$VENV/.pip-uv.log" >&2
            exit 1
        fi
        "$VENV/bin/python" -m uv pip install -q --python "$VENV/bin/python" ${constraints:+-c "$constraints"} \
            -e "$ROOT[$extras]"
        echo "$wanted" > "$stamp"
    fi
}

run_together() {
    # run_together NAME COMMAND [NAME COMMAND ...]: the commands at once (each a bash -c string, its output in
    # a log printed when all have ended); fails if any failed. Interrupts are passed on (see _await_all).
    run_beside "$@" --
}

run_beside() {
    # run_beside NAME COMMAND [NAME COMMAND ...] -- [MAIN [ARG ...]]: MAIN in the foreground with its output as it
    # comes, the named commands beside it (each a bash -c string, nice'd so that MAIN keeps the cores it needs,
    # its output in a log printed when all have ended; without MAIN, not nice'd); fails if any failed.
    # Interrupts are passed on (see _await_all).
    local names=() pids=() logs=() status=0 n nice=()
    local rest=("$@")
    while [ ${#rest[@]} -gt 0 ] && [ "${rest[0]}" != "--" ]; do rest=("${rest[@]:1}"); done
    [ ${#rest[@]} -gt 1 ] && nice=(nice -n 10)
    while [ $# -ge 2 ] && [ "$1" != "--" ]; do
        local log
        log="$(mktemp -t delay-broker-run-XXXXXX.log)"
        "${nice[@]}" bash -c "$2" >"$log" 2>&1 &
        names+=("$1") pids+=($!) logs+=("$log")
        shift 2
    done
    [ "${1:-}" = "--" ] && shift
    local main=()
    if [ $# -gt 0 ]; then
        "$@" &
        main=($!)
    fi
    _await_all "${main[@]}" "${pids[@]}" || true
    local statuses=("${_statuses[@]}")
    [ ${#main[@]} -eq 0 ] || { status="${statuses[0]}"; statuses=("${statuses[@]:1}"); }
    for n in "${!pids[@]}"; do
        echo "=== ${names[$n]} (exit ${statuses[$n]})" >&2
        cat "${logs[$n]}"
        rm -f "${logs[$n]}"
        [ "${statuses[$n]}" -eq 0 ] || status="${statuses[$n]}"
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
