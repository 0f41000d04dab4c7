# livecov — the two commands of the README, and the ones around them.
.PHONY: test demo deps build bench fuzz

# Installs every prerequisite (idempotently), then runs all tests.
test: deps
	cargo build --workspace --all-targets
	tests/scripts/check-versions.sh
	cargo test --workspace

deps:
	@tests/scripts/install-deps.sh

build:
	cargo build --workspace --release

# The main job on this machine.
demo: deps
	@tests/scripts/demo.sh

# Benchmarks against the LLVM tools (not part of CI).
bench: deps
	@tests/scripts/bench.sh

# Fuzz the parsers of untrusted bytes (needs a nightly toolchain and cargo-fuzz).
fuzz:
	agent-rust/fuzz/seed-corpus.py
	cd agent-rust/fuzz && cargo +nightly fuzz run mapping -- -max_total_time=60
	cd agent-rust/fuzz && cargo +nightly fuzz run profile -- -max_total_time=60
	cd agent-rust/fuzz && cargo +nightly fuzz run indexed_profile -- -max_total_time=60
	cd agent-rust/fuzz && cargo +nightly fuzz run fleet -- -max_total_time=60
	sidecar/fuzz/seed-lcov.sh
	cd sidecar/fuzz && cargo +nightly fuzz run lcov_merge -- -max_total_time=60
	sidecar/fuzz/seed-corpus.sh
	cd sidecar/fuzz && cargo +nightly fuzz run go_coverage -- -max_total_time=60
