#!/usr/bin/env bash
# The Python environments of the Python hook's tests and benchmark: one venv
# per interpreter the hook is tested on, each with the pinned packages of
# fixtures/python/requirements.txt (Flask, gunicorn, coverage.py) and the hook
# installed from hooks/python the way users install it (not editable: its
# .pth file is the one pip installs):
#
#   target/python-venv        the system's python3 (Debian 12: 3.11), which
#                             every other test uses
#   target/python-venv-3.12   pyenv's newest 3.12
#   target/python-venv-3.13   pyenv's newest 3.13
#
# The pyenv interpreters are installed with `pyenv install` when pyenv has
# none of that minor version yet.
#
# Quick when up to date: a venv is made again only when the requirements,
# the hook's pyproject.toml or its interpreter changed, and the hook is
# installed again only when one of its files changed (hashes kept in each
# venv). Safe to run from several test processes at once (one flock).
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
# The minor versions beside the system's python3, from pyenv.
pyenv_versions=(3.12 3.13)

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
apt_install() {
    local missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "deps-python: installing ${missing[*]}"
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
}
apt_install python3 python3-venv

pyenv=$(command -v pyenv || echo "${PYENV_ROOT:-$HOME/.pyenv}/bin/pyenv")
if [ ! -x "$pyenv" ]; then
    echo "deps-python: pyenv is missing; the hook's tests run on Python ${pyenv_versions[*]} from pyenv:" >&2
    echo "  install it (https://github.com/pyenv/pyenv#installation) or put it on PATH" >&2
    exit 1
fi

mkdir -p "$root/target"
exec 9>"$root/target/python-venv.lock"
flock 9

# The interpreter of a pyenv minor version, installed first if need be (the
# build dependencies are those pyenv's wiki lists for Debian).
pyenv_python() {
    local prefix
    if ! prefix=$("$pyenv" prefix "$1" 2>/dev/null); then
        echo "deps-python: pyenv install $1 (builds CPython: a few minutes)" >&2
        apt_install build-essential libssl-dev zlib1g-dev libbz2-dev libreadline-dev libsqlite3-dev \
            libncursesw5-dev xz-utils tk-dev libxml2-dev libxmlsec1-dev libffi-dev liblzma-dev >&2
        "$pyenv" install --skip-existing "$1" >&2
        prefix=$("$pyenv" prefix "$1")
    fi
    echo "$prefix/bin/python3"
}

hook_hash=$(cd "$root/hooks/python" && find . -type f \( -name '*.py' -o -name '*.pth' -o -name '*.toml' \) -not -path './build/*' | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -d' ' -f1)

# make_venv VENV PYTHON: VENV up to date, made with PYTHON.
make_venv() {
    local venv=$1 python=$2 env_hash
    env_hash=$(cat "$root/fixtures/python/requirements.txt" "$root/hooks/python/pyproject.toml" <(echo "$python"; "$python" -VV) | sha256sum | cut -d' ' -f1)
    if [ "$(cat "$venv/.env-hash" 2>/dev/null)" != "$env_hash" ]; then
        echo "deps-python: making $venv ($("$python" -V))"
        rm -rf "$venv"
        "$python" -m venv "$venv"
        "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$root/fixtures/python/requirements.txt"
        echo "$env_hash" > "$venv/.env-hash"
    fi
    if [ "$(cat "$venv/.hook-hash" 2>/dev/null)" != "$hook_hash" ]; then
        echo "deps-python: installing the hook from hooks/python into $venv"
        "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps --no-build-isolation --force-reinstall "$root/hooks/python"
        echo "$hook_hash" > "$venv/.hook-hash"
    fi
}

make_venv "$root/target/python-venv" /usr/bin/python3
for version in "${pyenv_versions[@]}"; do
    make_venv "$root/target/python-venv-$version" "$(pyenv_python "$version")"
done
