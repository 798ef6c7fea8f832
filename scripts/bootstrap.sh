#!/usr/bin/env bash
# Make this checkout ready to run: system packages (MariaDB server, galera-4 and rsync, mysqlclient
# build deps; chromium for the browser tests, optional), a .venv in the repo root, and `pip install -e '.[test,docs]'` into it.
# Idempotent and quick when nothing changed. Starts no server: the Python side
# (notifyq.localserver) runs its own private one, or a Galera cluster (tests/cluster).
# Run it, or source it: when sourced it runs in a subshell, so a failure never
# exits (or changes the options of) the calling shell.

_notifyq_bootstrap() {
    set -euo pipefail
    local root
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    cd "$root"
    say() { echo "bootstrap: $*"; }
    die() { echo "bootstrap: ERROR: $*" >&2; exit 1; }

    # --- Python >= 3.11 ------------------------------------------------------
    local py="" cand
    for cand in python3.13 python3.12 python3.11 python3; do
        if command -v "$cand" >/dev/null 2>&1 &&
            "$cand" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
            py="$(command -v "$cand")"
            break
        fi
    done
    [ -n "$py" ] || die "python3 >= 3.11 not found; install it (Debian 12: sudo apt-get install python3 python3-venv python3-dev)"
    local pyver
    pyver="$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"

    # --- system packages -----------------------------------------------------
    # mysqlclient has no Linux wheels: pip compiles it, which needs a C compiler,
    # Python headers and the MariaDB/MySQL client library found via pkg-config.
    local missing=()
    if ! command -v pkg-config >/dev/null 2>&1; then
        missing+=(pkg-config libmariadb-dev)
    elif ! pkg-config --exists libmariadb && ! pkg-config --exists mysqlclient; then
        missing+=(libmariadb-dev)
    fi
    # The server is often in /usr/sbin, which is not on a normal user's PATH.
    if ! PATH="$PATH:/usr/sbin:/usr/local/mysql/bin" command -v mariadbd >/dev/null 2>&1 &&
        ! PATH="$PATH:/usr/sbin:/usr/local/mysql/bin" command -v mysqld >/dev/null 2>&1; then
        missing+=(mariadb-server)
    fi
    # tests/cluster runs a private 3-node Galera cluster: the wsrep provider library, and rsync
    # for the state transfers that bring a joining node up to date.
    if [ ! -e /usr/lib/galera/libgalera_smm.so ] && [ ! -e /usr/lib/libgalera_smm.so ]; then
        missing+=(galera-4)
    fi
    command -v rsync >/dev/null 2>&1 || missing+=(rsync)
    command -v cc >/dev/null 2>&1 || missing+=(build-essential)
    # Debian splits these out of python3; only the apt names of the distro python are known.
    local pypkg=python3
    [ "$py" = /usr/bin/python3 ] || pypkg="python$pyver"
    "$py" -c 'import sysconfig, os, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' ||
        missing+=("$pypkg-dev")
    if [ ! -x .venv/bin/python ]; then
        "$py" -c 'import ensurepip, venv' 2>/dev/null || missing+=("$pypkg-venv")
    fi

    if [ "${#missing[@]}" -gt 0 ]; then
        if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
            say "installing ${missing[*]} (apt-get)"
            export DEBIAN_FRONTEND=noninteractive
            apt-get update -qq
            apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
        elif command -v apt-get >/dev/null 2>&1; then
            die "missing system packages; run: sudo apt-get install -y ${missing[*]}"
        else
            die "missing system packages (Debian names): ${missing[*]}; install the equivalents with your package manager"
        fi
    fi

    # The status pages' browser tests (tests/web) drive the distribution's Chromium with
    # Playwright (no browser download). Optional: where it cannot be installed they skip, with
    # one line saying why.
    if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
        if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
            say "installing chromium (apt-get) for the browser tests"
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null ||
                { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; } ||
                say "chromium could not be installed: the browser tests will skip"
        else
            say "no chromium: the browser tests will skip (Debian: sudo apt-get install chromium)"
        fi
    fi

    # --- virtualenv ----------------------------------------------------------
    # A venv copied from another machine (or whose python was removed) is useless.
    if [ -e .venv ] && ! .venv/bin/python -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
        say "existing .venv is broken or too old; recreating it"
        rm -rf .venv
    fi
    if [ ! -x .venv/bin/python ]; then
        say "creating .venv with $py (Python $pyver)"
        "$py" -m venv .venv
    fi

    [ -f pyproject.toml ] || die "no pyproject.toml in $root"
    local want have=""
    want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
    [ -f .venv/.notifyq-installed ] && have="$(cat .venv/.notifyq-installed)"
    if [ "$want" != "$have" ]; then
        say "installing notifyq and its dependencies into .venv (pip install -e '.[test,docs]')"
        .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test,docs]'
        echo "$want" >.venv/.notifyq-installed
    else
        say ".venv is up to date"
    fi

    # --- Django 6 beside it ---------------------------------------------------
    # tests/apps/test_django_tasks.py runs the Django project on Django 6's own task framework
    # too, which needs Python 3.12+: a second venv, .venv-django6, where such a Python is found
    # (on PATH, or among pyenv's versions). Optional: without one those tests skip.
    local py6="" pyroot
    pyroot="$(pyenv root 2>/dev/null || true)"
    for cand in python3.13 python3.12 ${pyroot:+"$pyroot"/versions/3.1[23]*/bin/python3}; do
        if command -v "$cand" >/dev/null 2>&1 &&
            "$cand" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
            py6="$(command -v "$cand")"
            break
        fi
    done
    if [ -z "$py6" ]; then
        say "no Python 3.12+: the Django 6 tests will skip"
    else
        want="$want-django6"
        have=""
        [ -f .venv-django6/.notifyq-installed ] && have="$(cat .venv-django6/.notifyq-installed)"
        if [ "$want" != "$have" ]; then
            say "installing notifyq with Django 6 into .venv-django6 ($py6)"
            { [ -x .venv-django6/bin/python ] || "$py6" -m venv .venv-django6; } &&
                .venv-django6/bin/python -m pip install -q --disable-pip-version-check -e '.[django]' 'django>=6.0' &&
                echo "$want" >.venv-django6/.notifyq-installed ||
                say "could not make .venv-django6: the Django 6 tests will skip"
        fi
    fi
}

if [ "${BASH_SOURCE[0]}" != "$0" ]; then
    # Sourced: isolate set -e / exit in a subshell and hand back its status.
    (_notifyq_bootstrap)
    return $?
fi
_notifyq_bootstrap
