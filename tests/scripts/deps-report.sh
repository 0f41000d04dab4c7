#!/usr/bin/env bash
# The readers of `livecov report --format cobertura` that tests/tests/report.rs
# runs: pycobertura and diff-cover from PyPI, in target/report-venv (the
# system's python3). Quick when up to date: the venv is made again only when
# the pinned versions or the interpreter changed (a hash kept in the venv).
# Safe to run from several test processes at once (one flock).
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
venv=$root/target/report-venv
packages=(pycobertura==4.1.0 diff-cover==11.0.1)

if ! /usr/bin/python3 -m venv --help >/dev/null 2>&1; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "deps-report: installing python3-venv"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends python3 python3-venv >/dev/null
fi

mkdir -p "$root/target"
exec 9>"$root/target/report-venv.lock"
flock 9

env_hash=$( (printf '%s\n' "${packages[@]}"; /usr/bin/python3 -VV) | sha256sum | cut -d' ' -f1)
if [ "$(cat "$venv/.env-hash" 2>/dev/null)" != "$env_hash" ]; then
    echo "deps-report: making $venv (${packages[*]})"
    rm -rf "$venv"
    /usr/bin/python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "${packages[@]}"
    echo "$env_hash" > "$venv/.env-hash"
fi
