//! The `livecov` binary of this workspace (`cargo build -p livecov-cli`), as the end-to-end tests run it.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use crate::tools::workspace_root;

/// The `livecov` binary of this workspace, built once per test process.
pub fn livecov_bin() -> &'static PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let root = workspace_root();
        let status = Command::new(env!("CARGO"))
            .args(["build", "--quiet", "-p", "livecov-cli", "--bin", "livecov"])
            .current_dir(&root)
            .status()
            .expect("run cargo build for the livecov binary");
        assert!(status.success(), "cargo build -p livecov-cli failed");
        root.join("target/debug/livecov")
    })
}
