#!/usr/bin/env bash
# The Python environment of the Python hook's tests and benchmark:
# target/python-venv with the pinned packages of fixtures/python/requirements.txt
# (Flask, gunicorn, coverage.py) and the hook installed from hooks/python the
# way users install it (not editable: its .pth file is the one pip installs).
#
# Quick when up to date: the venv is made again only when the requirements,
# the hook's pyproject.toml or the interpreter changed, and the hook is
# installed again only when one of its files changed (hashes kept in the venv).
# Safe to run from several test processes at once (one flock).
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
venv="$root/target/python-venv"
python=/usr/bin/python3

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
missing=()
for p in python3 python3-venv; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "deps-python: installing ${missing[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

mkdir -p "$root/target"
exec 9>"$root/target/python-venv.lock"
flock 9

env_hash=$(cat "$root/fixtures/python/requirements.txt" "$root/hooks/python/pyproject.toml" <("$python" -VV) | sha256sum | cut -d' ' -f1)
if [ "$(cat "$venv/.env-hash" 2>/dev/null)" != "$env_hash" ]; then
    echo "deps-python: making $venv"
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$root/fixtures/python/requirements.txt"
    echo "$env_hash" > "$venv/.env-hash"
fi

hook_hash=$(cd "$root/hooks/python" && find . -type f \( -name '*.py' -o -name '*.pth' -o -name '*.toml' \) -not -path './build/*' | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -d' ' -f1)
if [ "$(cat "$venv/.hook-hash" 2>/dev/null)" != "$hook_hash" ]; then
    echo "deps-python: installing the hook from hooks/python"
    "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps --no-build-isolation --force-reinstall "$root/hooks/python"
    echo "$hook_hash" > "$venv/.hook-hash"
fi
