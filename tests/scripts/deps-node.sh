#!/usr/bin/env bash
# Installs the Node fixtures' tools (fixtures/node/package-lock.json: c8 to
# compare the hook's reports with, tsc for the TypeScript fixture) into
# fixtures/node/node_modules with `npm ci`, when they are missing or the lock
# file changed since the last install; otherwise returns at once.
set -euo pipefail

cd "$(dirname "$0")/../../fixtures/node"
if ! command -v npm >/dev/null; then
    echo "deps-node: npm is missing (tests/scripts/install-deps.sh installs Node.js and npm)" >&2
    exit 1
fi
stamp=node_modules/.livecov-lock-sha256
want=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x node_modules/.bin/c8 ] && [ -x node_modules/.bin/tsc ]; then
    exit 0
fi
echo "deps-node: npm ci in fixtures/node"
npm ci --no-audit --no-fund --loglevel=error >/dev/null
echo "$want" > "$stamp"
