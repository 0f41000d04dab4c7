//! Running built fixtures with their inputs, one folder per run, each execution
//! writing its own `.profraw` through `LLVM_PROFILE_FILE`.
//!
//! Run folders are `<fixture out dir>/runs/<pid>/<run label>/`: private to the
//! test process, so concurrent test binaries never touch each other's profiles.
//! Folders of processes that no longer exist are removed.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Longest an execution may take before it is killed and the test fails.
const EXECUTION_TIMEOUT: Duration = Duration::from_secs(60);

/// One execution of a fixture: its arguments and the exit status it must end with.
pub(crate) struct Execution {
    pub args: &'static [&'static str],
    pub status: i32,
}

/// Makes this process's empty run folder for `label` under `out_dir/runs/`.
pub(crate) fn fresh_run_dir(out_dir: &Path, label: &str) -> PathBuf {
    let runs = out_dir.join("runs");
    remove_stale_run_dirs(&runs);
    let dir = runs.join(std::process::id().to_string()).join(label);
    if dir.exists() {
        fs::remove_dir_all(&dir).unwrap_or_else(|e| panic!("cannot remove {}: {e}", dir.display()));
    }
    fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
    dir
}

/// Removes `runs/<pid>` folders whose process is gone.
fn remove_stale_run_dirs(runs: &Path) {
    let Ok(entries) = fs::read_dir(runs) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if pid != std::process::id() && !Path::new("/proc").join(pid.to_string()).exists() {
            // Another process may be removing it at the same time: ignore errors.
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

/// Runs `binary` once per execution inside `dir` (its working directory), with
/// `LLVM_PROFILE_FILE=dir/<n>.profraw` and stdout/stderr saved as `<n>.stdout`
/// and `<n>.stderr`. Returns the `.profraw` files written, sorted.
pub(crate) fn execute(binary: &Path, dir: &Path, executions: &[Execution]) -> Vec<PathBuf> {
    for (index, execution) in executions.iter().enumerate() {
        let profile = dir.join(format!("{index}.profraw"));
        let stdout_path = dir.join(format!("{index}.stdout"));
        let stderr_path = dir.join(format!("{index}.stderr"));
        let create = |path: &Path| {
            File::create(path).unwrap_or_else(|e| panic!("cannot create {}: {e}", path.display()))
        };
        let mut child = Command::new(binary)
            .args(execution.args)
            .current_dir(dir)
            .env("LLVM_PROFILE_FILE", &profile)
            .stdin(Stdio::null())
            .stdout(create(&stdout_path))
            .stderr(create(&stderr_path))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
        let started = Instant::now();
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if started.elapsed() > EXECUTION_TIMEOUT => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!(
                        "{} {:?} ran longer than {EXECUTION_TIMEOUT:?}: killed",
                        binary.display(),
                        execution.args
                    );
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                Err(e) => panic!("cannot wait for {}: {e}", binary.display()),
            }
        };
        if status.code() != Some(execution.status) {
            panic!(
                "{} {:?} ended with {status}, expected exit status {}\n--- stderr ---\n{}",
                binary.display(),
                execution.args,
                execution.status,
                fs::read_to_string(&stderr_path).unwrap_or_default()
            );
        }
        assert!(
            profile.is_file(),
            "{} {:?} wrote no profile {}",
            binary.display(),
            execution.args,
            profile.display()
        );
    }
    let mut profraws: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|entry| entry.expect("readable run folder entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "profraw"))
        .collect();
    profraws.sort();
    profraws
}
