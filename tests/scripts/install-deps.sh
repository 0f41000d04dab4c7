#!/usr/bin/env bash
# Installs what the tests need on a fresh Debian machine, and does nothing
# (quickly) when it is all there already:
# - LLVM 22's llvm-cov and llvm-profdata (rustup component llvm-tools), the oracle;
# - clang-19, clang-14 and clang-13 with their profile runtimes, to build the
#   C/C++ fixtures (clang-13's libclang_rt.profile is in libclang-common-13-dev,
#   which clang-13 depends on; there is no libclang-rt-13-dev);
# - llvm-profdata-14 and llvm-profdata-13, to index clang-14 and clang-13
#   profiles for llvm-cov 22, and llvm-profdata-19, for indexed profiles of
#   LLVM 19 as livecov's input;
# - cmake and pkg-config, to build C programs against liblivecov as the docs say;
# - jq, which the docs' examples use to read livecov's JSON (tests/tests/docs.rs runs them),
#   and lcov (genhtml) and kubectl (`kubectl kustomize`, no cluster), which docs/kubernetes.md runs;
# - Node.js and npm, for the Node hook and its fixtures;
# - docker-registry (the CNCF distribution registry) and skopeo, a registry
#   on loopback and a second client of it for `livecov push` (tests/tests/push.rs,
#   docs/cli.md), with htpasswd (apache2-utils) for its login and openssl
#   for its certificates.
set -euo pipefail

apt_packages=(clang-19 clang-14 clang-13 llvm-19 llvm-14 llvm-13 libclang-rt-14-dev libclang-rt-19-dev libclang-common-13-dev curl dnsmasq cmake pkg-config jq lcov chromium docker-registry skopeo apache2-utils openssl)

missing=()
for p in "${apt_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "install-deps: installing ${missing[*]}"
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    echo "install-deps: installing nodejs and npm"
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi

# Debian's kubectl is kubernetes-client; a kubectl from elsewhere (another
# package owning /usr/bin/kubectl) does as well, and the two would conflict.
if ! command -v kubectl >/dev/null; then
    echo "install-deps: installing kubernetes-client (kubectl)"
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends kubernetes-client >/dev/null
fi

sysroot=$(rustc --print sysroot)
host=$(rustc -vV | sed -n 's/^host: //p')
if [ ! -x "$sysroot/lib/rustlib/$host/bin/llvm-cov" ]; then
    echo "install-deps: adding the rustup component llvm-tools"
    rustup component add llvm-tools
fi

"$(dirname "$0")/deps-node.sh"
"$(dirname "$0")/deps-python.sh"
"$(dirname "$0")/deps-nginx.sh"
"$(dirname "$0")/deps-dnsmasq.sh"
"$(dirname "$0")/deps-redis.sh"
"$(dirname "$0")/deps-fmt.sh"
"$(dirname "$0")/deps-go.sh"
"$(dirname "$0")/deps-report.sh"
