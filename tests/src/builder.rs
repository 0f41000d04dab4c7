//! Building fixtures into `<workspace>/target/fixtures/<fixture>/`, safely when
//! several test processes build at once: a lock file per fixture, outputs made
//! in a private temporary folder and renamed into place, and a stamp (commands
//! and source contents) so that an up-to-date fixture is not rebuilt.

use crate::tools::run_checked;
use std::collections::hash_map::DefaultHasher;
use std::fs::{self, File};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Holds the fixture's lock file (an exclusive flock) until dropped.
pub(crate) struct BuildLock {
    _file: File,
}

/// Creates `out_dir` and takes its lock, waiting for other processes.
pub(crate) fn lock(out_dir: &Path) -> BuildLock {
    fs::create_dir_all(out_dir)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", out_dir.display()));
    let path = out_dir.join(".lock");
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("cannot open the lock file {}: {e}", path.display()));
    file.lock()
        .unwrap_or_else(|e| panic!("cannot lock {}: {e}", path.display()));
    BuildLock { _file: file }
}

/// Builds native outputs with the commands from `commands(dir)`, which must write
/// the files named in `outputs` into `dir`, then moves them into `out_dir`.
///
/// Skipped when `out_dir` holds all outputs and a stamp of the same commands and
/// source contents. Returns the paths of the outputs in `out_dir`.
pub(crate) fn build_native(
    out_dir: &Path,
    sources: &[PathBuf],
    outputs: &[&str],
    commands: impl Fn(&Path) -> Vec<Command>,
) -> Vec<PathBuf> {
    let _lock = lock(out_dir);
    let finals: Vec<PathBuf> = outputs.iter().map(|name| out_dir.join(name)).collect();
    let stamp_path = out_dir.join(".stamp");
    let stamp = stamp_text(sources, &commands(Path::new("@OUT@")));
    let up_to_date = finals.iter().all(|path| path.is_file())
        && fs::read_to_string(&stamp_path).is_ok_and(|old| old == stamp);
    if up_to_date {
        return finals;
    }

    let temp = out_dir.join(format!(".build-{}", std::process::id()));
    if temp.exists() {
        fs::remove_dir_all(&temp)
            .unwrap_or_else(|e| panic!("cannot remove {}: {e}", temp.display()));
    }
    fs::create_dir_all(&temp).unwrap_or_else(|e| panic!("cannot create {}: {e}", temp.display()));
    for mut command in commands(&temp) {
        let what = format!("building {}", out_dir.display());
        run_checked(&mut command, &what);
    }
    for (name, target) in outputs.iter().zip(&finals) {
        let built = temp.join(name);
        fs::rename(&built, target).unwrap_or_else(|e| {
            panic!(
                "cannot move {} to {}: {e}",
                built.display(),
                target.display()
            )
        });
    }
    fs::write(&stamp_path, stamp)
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", stamp_path.display()));
    fs::remove_dir_all(&temp).unwrap_or_else(|e| panic!("cannot remove {}: {e}", temp.display()));
    finals
}

/// What decides whether a build is up to date: the commands and a hash of each
/// source file's contents.
fn stamp_text(sources: &[PathBuf], commands: &[Command]) -> String {
    let mut text = String::new();
    for command in commands {
        text.push_str(&format!(
            "{:?} in {:?}\n",
            command,
            command.get_current_dir()
        ));
    }
    for source in sources {
        let contents = fs::read(source)
            .unwrap_or_else(|e| panic!("cannot read the fixture source {}: {e}", source.display()));
        let mut hasher = DefaultHasher::new();
        contents.hash(&mut hasher);
        text.push_str(&format!("{} {:016x}\n", source.display(), hasher.finish()));
    }
    text
}

/// Builds the Rust fixture workspace with `-C instrument-coverage` into
/// `target_dir` (cargo itself rebuilds only what changed and locks its target
/// folder). Returns `<target_dir>/debug/<binary>`.
pub(crate) fn build_cargo(manifest_dir: &Path, target_dir: &Path, binary: &str) -> PathBuf {
    let _lock = lock(target_dir);
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .args(["build", "--offline", "--locked", "--manifest-path"])
        .arg(manifest_dir.join("Cargo.toml"))
        .current_dir(manifest_dir);
    coverage_build(&mut command, target_dir);
    run_checked(&mut command, "cargo build of the Rust fixture");
    let path = target_dir.join("debug").join(binary);
    assert!(path.is_file(), "cargo built no {}", path.display());
    path
}

/// Makes `command`, a nested cargo build, build with `-C instrument-coverage`
/// into `target_dir`, without what the outer cargo set (see
/// [`without_outer_cargo`]). Without `--target`, the flag also instruments
/// proc-macros and build scripts, which write their profiles in the folder
/// the compiler runs in (a path dependency's, in the tree): those go into
/// `target_dir`, merged per program.
pub fn coverage_build<'c>(command: &'c mut Command, target_dir: &Path) -> &'c mut Command {
    without_outer_cargo(command);
    command
        .env("RUSTFLAGS", "-C instrument-coverage")
        .env("CARGO_TARGET_DIR", target_dir)
        .env("LLVM_PROFILE_FILE", target_dir.join("build-programs-%m.profraw"))
}

/// Drops what the outer cargo (running these tests) or the user set that would
/// change a nested cargo build: target dir, wrappers, flags, profiles...
pub fn without_outer_cargo(command: &mut Command) {
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        let interferes = (key.starts_with("CARGO") && key != "CARGO_HOME")
            || key.starts_with("__CARGO")
            || matches!(
                &*key,
                "RUSTC"
                    | "RUSTC_WRAPPER"
                    | "RUSTC_WORKSPACE_WRAPPER"
                    | "RUSTDOC"
                    | "RUSTDOCFLAGS"
                    | "RUSTFLAGS"
                    | "RUSTC_BOOTSTRAP"
                    | "LLVM_PROFILE_FILE"
            );
        if interferes {
            command.env_remove(&*key);
        }
    }
}
