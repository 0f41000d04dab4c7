# Sourced by deps-nginx.sh, deps-redis.sh and deps-fmt.sh: a program from Debian's source
# package, built with clang-19 and coverage under target/<package>/.
#
# build_debian_source PACKAGE BUILT BUILD, with two functions of the caller:
# `BUILT DIR` tells whether DIR holds a complete build, `BUILD DIR` builds
# in DIR/src (the unpacked sources, the current folder) and logs to DIR.
# - a deb-src entry for each of the machine's Debian archive entries
#   (/etc/apt/sources.list.d/livecov-deb-src.sources, written only when it
#   would change), so that `apt-get source` finds the package;
# - the newest version `apt-cache showsrc PACKAGE` lists whose files the
#   archive has (a mirror may list versions it does not hold), unpacked with
#   Debian's patches (dpkg-source, in dpkg-dev);
# - built in target/PACKAGE/<version>-<hash> (the version without its epoch),
#   the hash of the calling script (its flags), of this one and of the
#   compiler's version: a new version, flag or compiler is a new build, and
#   an unchanged one is not built again; target/PACKAGE/current points at
#   the build in use.
# Safe to run from several processes at once (one flock per package).

cc=clang-19

# ensure_packages SAY PACKAGE...: installs the Debian packages missing (SAY
# names the script in its message).
ensure_packages() {
    local say=$1 missing=() p sudo=""
    shift
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -gt 0 ] || return 0
    echo "$say: installing ${missing[*]}"
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

build_debian_source() {
    local package=$1 built=$2 build_in=$3
    local root out sudo="" say="deps-$1"
    root=$(cd "$(dirname "$0")/../.." && pwd)
    out="$root/target/$package"
    [ "$(id -u)" -eq 0 ] || sudo="sudo"

    ensure_packages "$say" dpkg-dev make clang-19 libclang-rt-19-dev

    mkdir -p "$out"
    exec 9>"$out.lock"
    flock 9

    # The source entries: the machine's own entries of this Debian release
    # (suites `codename` and `codename-*`), deb822 or one-line, as deb-src.
    local codename src_list wanted f
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
        echo "$say: no entry of Debian $codename in /etc/apt/sources.list* to take $package's source from" >&2
        exit 1
    fi
    if [ "$(cat "$src_list" 2>/dev/null)" != "$wanted" ]; then
        echo "$say: adding deb-src entries ($src_list)"
        printf '%s\n' "$wanted" | $sudo tee "$src_list" >/dev/null
        $sudo apt-get update -qq
    elif ! apt-cache showsrc "$package" 2>/dev/null | grep -q '^Version:'; then
        $sudo apt-get update -qq
    fi

    local versions v i
    versions=$(apt-cache showsrc "$package" | sed -n 's/^Version: //p' | sort -u)
    if [ -z "$versions" ]; then
        echo "$say: apt-cache showsrc $package lists no version" >&2
        exit 1
    fi
    # Newest first (dpkg's order, not sort's).
    local ordered=()
    for v in $versions; do
        i=0
        while [ $i -lt ${#ordered[@]} ] && dpkg --compare-versions "${ordered[$i]}" gt "$v"; do i=$((i + 1)); done
        ordered=("${ordered[@]:0:$i}" "$v" "${ordered[@]:$i}")
    done

    local flags_hash version key build start
    flags_hash=$( (cat "$0" "${BASH_SOURCE[0]}"; "$cc" --version) | sha256sum | cut -c1-12)
    # A build of a listed version with these flags is kept (the archive had
    # its files); only without one are versions tried, newest first.
    for version in "${ordered[@]}"; do
        if "$built" "$out/${version#*:}-$flags_hash"; then
            ln -sfn "${version#*:}-$flags_hash" "$out/current"
            return 0
        fi
    done
    for version in "${ordered[@]}"; do
        key="${version#*:}-$flags_hash"   # no epoch: no colon in the paths
        build="$out/$key"
        echo "$say: building $package $version with $cc and coverage in $build"
        rm -rf "$build"
        mkdir -p "$build/download"
        if ! (cd "$build/download" && apt-get source --download-only -qq "$package=$version" >/dev/null 2>"$build/download.log"); then
            echo "$say: the archive has not the files of $package $version ($(tail -n 1 "$build/download.log")); trying an older one"
            rm -rf "$build"
            continue
        fi
        # apt checked the files against the archive's signed index: no keyring needed here.
        dpkg-source --no-check -x "$build/download/${package}_${version#*:}.dsc" "$build/src" >/dev/null
        start=$(date +%s)
        (cd "$build/src" && "$build_in" "$build")
        "$built" "$build" || { echo "$say: the build of $package $version left none of the programs it should" >&2; exit 1; }
        echo "$say: built in $(( $(date +%s) - start )) s"
        rm -rf "$build/download" "$build/download.log"
        # Earlier builds are of another version or other flags: no longer used.
        find "$out" -mindepth 1 -maxdepth 1 -type d ! -name "$key" -exec rm -rf {} +
        ln -sfn "$key" "$out/current"
        return 0
    done
    echo "$say: the archive has the files of none of $package's versions: ${ordered[*]}" >&2
    exit 1
}
