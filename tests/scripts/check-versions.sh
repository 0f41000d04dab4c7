#!/usr/bin/env bash
# Checks that the versions the manifests declare are true, so that livecov
# builds into a service's Cargo.lock as it is:
# - the agent (crate livecov) alone, every direct dependency at the oldest
#   version it allows (`cargo -Z direct-minimal-versions`): built and tested;
# - the workspace the same way: the CLI built and unit-tested, liblivecov
#   and the tests crate built;
# - the agent and the CLI with the oldest Rust they declare (rust-version),
#   over the minimal versions and over the newest versions that Rust supports;
#   liblivecov built and linked with it (before Rust 1.90, by `cc` with GNU
#   ld, not rust-lld).
# Resolutions are MSRV-aware (incompatible-rust-versions = fallback): the
# packages livecov does not name are the newest that support its
# rust-version, as cargo picks them for a user on that Rust.
# Each step runs in a copy under target/check-versions/ (the checkout's
# Cargo.lock is never touched); builds are cached there.
set -uo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
scratch=$root/target/check-versions
msrv=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' "$root/Cargo.toml")
msrv_cli=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' "$root/sidecar/Cargo.toml")
export CARGO_RESOLVER_INCOMPATIBLE_RUST_VERSIONS=fallback

for toolchain in nightly "$msrv" "$msrv_cli"; do
    if ! rustup run "$toolchain" cargo --version >/dev/null 2>&1; then
        echo "check-versions: installing Rust $toolchain"
        rustup toolchain install "$toolchain" --profile minimal >/dev/null || exit 1
    fi
done

failed=()
# step NAME DIR COMMAND...: runs COMMAND in DIR, its output kept in
# target/check-versions/NAME.log and shown when it fails.
step() {
    local name=$1 dir=$2 start=$SECONDS
    shift 2
    if (cd "$dir" && "$@") >"$scratch/$name.log" 2>&1; then
        echo "check-versions: ok     $name ($((SECONDS - start)) s)"
    else
        echo "check-versions: FAILED $name: $* (in a copy, $dir)"
        tail -n 40 "$scratch/$name.log" | sed 's/^/    /'
        failed+=("$name")
    fi
}

# copy DIR MEMBERS...: the workspace's manifests and sources with only
# MEMBERS as members (their path dependencies join them).
copy() {
    local dir=$1
    shift
    rm -rf "$dir"
    mkdir -p "$dir"
    local m
    for m in "$@" agent-rust; do
        [ -e "$dir/$m" ] || tar -C "$root" --exclude=./fuzz -cf - "$m" | tar -C "$dir" -xf -
    done
    local members
    members=$(printf '"%s", ' "$@")
    sed "s/^members = .*/members = [${members%, }]/" "$root/Cargo.toml" >"$dir/Cargo.toml"
}

# One version per package in a workspace, and direct-minimal-versions takes
# exactly the declared minimum of each direct dependency: the members must
# agree, so each is given the highest minimum any member declares for a
# package (semver-compatible requirements only).
align() {
    python3 - "$@" <<'EOF'
import re, sys
dep = re.compile(r'^([A-Za-z0-9_-]+) = (?:\{ version = )?"([0-9][0-9.]*)"')
def parts(v):
    p = [int(x) for x in v.split(".")]
    return tuple(p + [0] * (3 - len(p)))
def key(name, v):
    p = parts(v)
    return (name, p[0] or (0, p[1]))
def deps(lines):
    table = ""
    for i, line in enumerate(lines):
        if line.startswith("["):
            table = line
        m = "dependencies" in table and dep.match(line)
        if m:
            yield i, m
files = {path: open(path).read().splitlines(keepends=True) for path in sys.argv[1:]}
highest = {}
for lines in files.values():
    for _, m in deps(lines):
        k = key(m[1], m[2])
        if parts(m[2]) > parts(highest.get(k, "0")):
            highest[k] = m[2]
for path, lines in files.items():
    for i, m in list(deps(lines)):
        v = highest[key(m[1], m[2])]
        if v != m[2]:
            lines[i] = lines[i][: m.start(2)] + v + lines[i][m.end(2) :]
    open(path, "w").write("".join(lines))
EOF
}

mkdir -p "$scratch"

# The agent alone: what a service that adds it gets at the oldest versions.
# AGENT_PACKAGES names the packages of the agent's tree under the
# checkout's Cargo.lock (make test checks it there); older versions bring
# other packages, so that one test is left to make test.
agent=$scratch/agent
copy "$agent" agent-rust
step agent-minimal-resolve "$agent" cargo +nightly update -Z direct-minimal-versions
step agent-minimal-test "$agent" env CARGO_TARGET_DIR="$scratch/target-minimal" \
    cargo test -p livecov -- --skip agent_packages_are_what_cargo_tree_says
step agent-minimal-msrv "$agent" env CARGO_TARGET_DIR="$scratch/target-msrv" \
    cargo "+$msrv" check -p livecov --all-targets

# The workspace: the CLI, liblivecov and the tests crate at the oldest
# versions they declare.
ws=$scratch/workspace
copy "$ws" agent-rust agent-native sidecar tests
align "$ws"/{agent-rust,agent-native,sidecar,tests}/Cargo.toml
step workspace-minimal-resolve "$ws" cargo +nightly update -Z direct-minimal-versions
step cli-minimal-test "$ws" env CARGO_TARGET_DIR="$scratch/target-minimal" cargo test -p livecov-cli --lib --bins
step native-tests-minimal-build "$ws" env CARGO_TARGET_DIR="$scratch/target-minimal" \
    cargo check -p livecov-native -p livecov-tests --all-targets

# The newest versions that support rust-version, as a user on that Rust
# resolves them.
latest=$scratch/latest
copy "$latest" agent-rust agent-native sidecar
cp "$root/Cargo.lock" "$latest/"
step latest-resolve "$latest" cargo update
step latest-msrv "$latest" env CARGO_TARGET_DIR="$scratch/target-msrv" \
    cargo "+$msrv" check -p livecov --all-targets
step latest-msrv-native "$latest" env CARGO_TARGET_DIR="$scratch/target-msrv-native" \
    cargo "+$msrv" build -p livecov-native --profile release-native
step latest-msrv-cli "$latest" env CARGO_TARGET_DIR="$scratch/target-msrv-cli" \
    cargo "+$msrv_cli" check -p livecov-cli --all-targets

if [ ${#failed[@]} -gt 0 ]; then
    echo "check-versions: FAILED: ${failed[*]} (logs in target/check-versions/)"
    echo "check-versions: a minimal-versions failure means a declared version is too old for the code"
    echo "check-versions: (raise it in the Cargo.toml); an msrv failure, that rust-version ($msrv for"
    echo "check-versions: the agent, $msrv_cli for the CLI) is too old for the code or its dependencies."
    exit 1
fi
echo "check-versions: the declared versions hold, and rust-version $msrv (agent), $msrv_cli (CLI)"
