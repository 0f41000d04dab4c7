#!/usr/bin/env bash
# redis from Debian's source package, built with clang-19 and coverage, for
# tests/scripts/bench-fleet.sh (48 replicas of a real C server with the agent
# preloaded). The same approach as deps-nginx.sh:
# - a deb-src entry for each of the machine's Debian archive entries
#   (/etc/apt/sources.list.d/livecov-deb-src.sources, the same file and the
#   same entries as deps-nginx.sh writes, written only when it would change);
# - the newest version `apt-cache showsrc redis` lists whose files the archive
#   has, unpacked with Debian's patches (dpkg-source, in dpkg-dev);
# - built with redis's own Makefile and its bundled deps (hiredis, lua,
#   linenoise, hdr_histogram), libc's malloc (no jemalloc), no TLS, no
#   systemd: nothing from a -dev package. CFLAGS reach redis and its deps,
#   so the Lua interpreter and hiredis are instrumented too. redis-server,
#   redis-cli and redis-benchmark come out of one build, in
#   target/redis/<version>-<hash>/src/src (the version without its epoch), the hash of this script (its
#   flags) and of the compiler's version: a new version, flag or compiler is
#   a new build, an unchanged one is not built again; target/redis/current
#   points at the build in use.
# Run by bench-fleet.sh only (not by `make test`). Safe to run from several
# processes at once (one flock).
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
out="$root/target/redis"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"

missing=()
for p in dpkg-dev make clang-19 libclang-rt-19-dev; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "deps-redis: installing ${missing[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

mkdir -p "$out"
exec 9>"$out.lock"
flock 9

# The source entries: the machine's own entries of this Debian release
# (suites `codename` and `codename-*`), deb822 or one-line, as deb-src.
codename=$(. /etc/os-release && echo "$VERSION_CODENAME")
src_list=/etc/apt/sources.list.d/livecov-deb-src.sources
wanted=$(
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] && [ "$f" != "$src_list" ] || continue
        awk -v codename="$codename" '
            function flush() {
                if (debian && types ~ /(^| )deb( |$)/) { print "Types: deb-src"; printf "%s", rest; print "" }
                types = ""; rest = ""; debian = 0
            }
            /^[ \t]*#/ { next }
            /^[ \t]*$/ { flush(); next }
            /^Types:/ { types = $0; sub(/^Types:[ \t]*/, "", types); next }
            /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == codename || index($i, codename "-") == 1) debian = 1 }
            { rest = rest $0 "\n" }
            END { flush() }' "$f"
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] || continue
        # One-line entries: `deb [options] URI suite components...`.
        awk -v codename="$codename" '$1 == "deb" {
            i = 2; options = ""
            if ($2 ~ /^\[/) { while ($i !~ /\]$/) { options = options " " $i; i++ } options = options " " $i; i++ }
            if ($(i + 1) != codename && index($(i + 1), codename "-") != 1) next
            components = ""; for (j = i + 2; j <= NF; j++) components = components " " $j
            sub(/^ /, "", options); gsub(/[\[\]]/, "", options)
            print "Types: deb-src"; print "URIs: " $i; print "Suites: " $(i + 1); print "Components:" components
            if (options != "") { n = split(options, o, " "); for (k = 1; k <= n; k++) { split(o[k], kv, "="); if (kv[1] == "signed-by") print "Signed-By: " kv[2] } }
            print "" }' "$f"
    done
)
if [ -z "$wanted" ]; then
    echo "deps-redis: no entry of Debian $codename in /etc/apt/sources.list* to take redis's source from" >&2
    exit 1
fi
if [ "$(cat "$src_list" 2>/dev/null)" != "$wanted" ]; then
    echo "deps-redis: adding deb-src entries ($src_list)"
    printf '%s\n' "$wanted" | $sudo tee "$src_list" >/dev/null
    $sudo apt-get update -qq
elif ! apt-cache showsrc redis 2>/dev/null | grep -q '^Version:'; then
    $sudo apt-get update -qq
fi

versions=$(apt-cache showsrc redis | sed -n 's/^Version: //p' | sort -u)
if [ -z "$versions" ]; then
    echo "deps-redis: apt-cache showsrc redis lists no version" >&2
    exit 1
fi
# Newest first (dpkg's order, not sort's).
ordered=()
for v in $versions; do
    i=0
    while [ $i -lt ${#ordered[@]} ] && dpkg --compare-versions "${ordered[$i]}" gt "$v"; do i=$((i + 1)); done
    ordered=("${ordered[@]:0:$i}" "$v" "${ordered[@]:$i}")
done

# What decides the build besides the version. OPTIMIZATION replaces redis's
# default (-O2, and -flto on some versions, which needs a linker plugin).
cc=clang-19
make_args=(
    CC="$cc"
    OPTIMIZATION="-O1"
    CFLAGS="-g -fprofile-instr-generate -fcoverage-mapping"
    LDFLAGS="-fprofile-instr-generate"
    MALLOC=libc
    BUILD_TLS=no
    USE_SYSTEMD=no
    V=1
)
flags_hash=$( (cat "$0"; "$cc" --version) | sha256sum | cut -c1-12)
built() { [ -x "$1/src/src/redis-server" ] && [ -x "$1/src/src/redis-benchmark" ] && [ -x "$1/src/src/redis-cli" ]; }

# A build of a listed version with these flags is kept (the archive had its
# files); only without one are versions tried, newest first.
for version in "${ordered[@]}"; do
    if built "$out/${version#*:}-$flags_hash"; then
        ln -sfn "${version#*:}-$flags_hash" "$out/current"
        exit 0
    fi
done
for version in "${ordered[@]}"; do
    key="${version#*:}-$flags_hash"   # no epoch: no colon in the paths
    build="$out/$key"
    echo "deps-redis: building redis $version with $cc and coverage in $build"
    rm -rf "$build"
    mkdir -p "$build/download"
    if ! (cd "$build/download" && apt-get source --download-only -qq "redis=$version" >/dev/null 2>"$build/download.log"); then
        echo "deps-redis: the archive has not the files of redis $version ($(tail -n 1 "$build/download.log")); trying an older one"
        rm -rf "$build"
        continue
    fi
    # apt checked the files against the archive's signed index: no keyring needed here.
    dpkg-source --no-check -x "$build/download/redis_${version#*:}.dsc" "$build/src" >/dev/null
    start=$(date +%s)
    (
        cd "$build/src"
        # LLVM_PROFILE_FILE: nothing instrumented runs during the build, but
        # should it, its profile stays out of the sources.
        LLVM_PROFILE_FILE="$build/build-%p.profraw" make -j"$(nproc)" "${make_args[@]}" >"$build/make.log" 2>&1 ||
            { tail -n 30 "$build/make.log" >&2; exit 1; }
    )
    built "$build" || { echo "deps-redis: the build of redis $version left no redis-server, redis-cli or redis-benchmark" >&2; exit 1; }
    echo "deps-redis: built in $(( $(date +%s) - start )) s"
    rm -rf "$build/download" "$build/download.log" "$build"/build-*.profraw
    # Earlier builds are of another version or other flags: no longer used.
    find "$out" -mindepth 1 -maxdepth 1 -type d ! -name "$key" -exec rm -rf {} +
    ln -sfn "$key" "$out/current"
    exit 0
done
echo "deps-redis: the archive has the files of none of redis's versions: ${ordered[*]}" >&2
exit 1
