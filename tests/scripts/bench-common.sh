# Sourced by the bench scripts: the host triple, LLVM 22's tools from the
# rustup llvm-tools component, and `clean_env`, an `env` prefix that drops
# what the caller (an outer cargo, make, a shell profile) set that would
# change a build: target dir, wrappers, flags, profile file names, and the
# agent's own settings.
host=$(rustc -vV | sed -n 's/^host: //p')
llvm_bin="$(rustc --print sysroot)/lib/rustlib/$host/bin"
profdata="$llvm_bin/llvm-profdata"
llvm_cov="$llvm_bin/llvm-cov"
for t in "$profdata" "$llvm_cov"; do
    [ -x "$t" ] || { echo "$(basename "$0"): $t missing (run tests/scripts/install-deps.sh)" >&2; exit 1; }
done

clean_env=(env)
while IFS= read -r name; do
    case "$name" in
        CARGO_HOME) ;;
        CARGO*|__CARGO*|RUSTC|RUSTC_WRAPPER|RUSTC_WORKSPACE_WRAPPER|RUSTDOC|RUSTDOCFLAGS|RUSTFLAGS|RUSTC_BOOTSTRAP|LLVM_PROFILE_FILE|LIVECOV_*)
            clean_env+=(-u "$name") ;;
    esac
done < <(compgen -e)
