//! The fixtures: where their sources are, how each is built, and the inputs of
//! its runs. Each fixture has at least two runs with different inputs and one
//! run made of several executions.

use crate::builder::{build_cargo, build_native};
use crate::runner::{execute, fresh_run_dir, Execution};
use crate::tools::{require_profile_runtime, system_tool};
use crate::{Fixture, Run, Toolchain};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A run as specified: a label and its executions.
struct RunSpec {
    label: &'static str,
    executions: &'static [Execution],
}

const fn ok(args: &'static [&'static str]) -> Execution {
    Execution { args, status: 0 }
}

const fn fails(args: &'static [&'static str], status: i32) -> Execution {
    Execution { args, status }
}

const RUST_RUNS: &[RunSpec] = &[
    RunSpec {
        label: "shapes",
        executions: &[ok(&[
            "shapes",
            "circle:1.5",
            "rect:2,3",
            "square:4",
            "tri:3,4,5",
        ])],
    },
    RunSpec {
        label: "stats",
        executions: &[ok(&["stats", "5", "3", "9", "-2", "7"])],
    },
    RunSpec {
        label: "combined",
        executions: &[
            ok(&["shapes", "circle:2"]),
            ok(&["words", "hello", "sky"]),
            ok(&["stats", "4", "4"]),
            fails(&["shapes", "tri:1,1,5"], 1),
            fails(&["words", "abc1"], 1),
            fails(&["frobnicate"], 2),
            fails(&[], 2),
        ],
    },
];

const C_RUNS: &[RunSpec] = &[
    RunSpec {
        label: "sum",
        executions: &[ok(&["-v", "sum", "5", "300", "-7"])],
    },
    RunSpec {
        label: "classify",
        executions: &[ok(&["classify", "5", "-3", "0", "12", "-40"])],
    },
    RunSpec {
        label: "combined",
        executions: &[
            ok(&["grade", "95", "81", "42", "120"]),
            ok(&["check", "abc", "x 1"]),
            ok(&["sum", "1", "2"]),
            fails(&["sum", "x"], 1),
            fails(&["nothing", "1"], 2),
            fails(&["-v"], 2),
        ],
    },
];

const CPP_RUNS: &[RunSpec] = &[
    RunSpec {
        label: "sum",
        executions: &[ok(&["sum", "1", "2", "3"])],
    },
    RunSpec {
        label: "animals",
        executions: &[ok(&["animals", "dog", "cat", "bird", "fish"])],
    },
    RunSpec {
        label: "combined",
        executions: &[
            fails(&["parse", "4", "x", "5z", "7"], 1),
            ok(&["parse", "10"]),
            fails(&["sum", "1", "q"], 1),
            fails(&["animals", "fish"], 1),
            fails(&["dance"], 2),
        ],
    },
];

const SHAREDLIB_RUNS: &[RunSpec] = &[
    RunSpec {
        label: "double",
        executions: &[ok(&["double", "3", "4"])],
    },
    RunSpec {
        label: "collatz",
        executions: &[ok(&["collatz", "27", "-1"])],
    },
    RunSpec {
        label: "combined",
        executions: &[
            ok(&["--name"]),
            ok(&["negate", "5"]),
            fails(&["double", "x"], 1),
            fails(&["explode", "1"], 2),
        ],
    },
];

fn abs(dir: &Path, names: &[&str]) -> Vec<PathBuf> {
    names.iter().map(|name| dir.join(name)).collect()
}

/// Runs every run of `spec` with `binary`.
fn make_runs(out_dir: &Path, binary: &Path, specs: &[RunSpec]) -> Vec<Run> {
    specs
        .iter()
        .map(|spec| {
            let dir = fresh_run_dir(out_dir, spec.label);
            let profraws = execute(binary, &dir, spec.executions);
            Run {
                label: spec.label.to_string(),
                args: spec
                    .executions
                    .iter()
                    .map(|e| e.args.iter().map(|a| a.to_string()).collect())
                    .collect(),
                profraws,
                dir,
            }
        })
        .collect()
}

/// `fixtures/rust`: cargo workspace with crates `app` (binary) and `shapes`.
pub(crate) fn rust(root: &Path) -> Fixture {
    let source_dir = root.join("fixtures/rust");
    let out_dir = root.join("target/fixtures/rust");
    let binary = build_cargo(&source_dir, &out_dir, "app");
    let sources = abs(
        &source_dir,
        &[
            "app/src/main.rs",
            "app/src/executor.rs",
            "app/src/stats.rs",
            "app/src/words.rs",
            "shapes/src/lib.rs",
            "shapes/src/geometry.rs",
            "shapes/src/parse.rs",
        ],
    );
    let runs = make_runs(&out_dir, &binary, RUST_RUNS);
    Fixture {
        name: "rust".into(),
        toolchain: Toolchain::Rustc,
        source_dir,
        sources,
        binary,
        objects: Vec::new(),
        runs,
    }
}

/// The coverage flags of every clang build.
const CLANG_FLAGS: &[&str] = &[
    "-fprofile-instr-generate",
    "-fcoverage-mapping",
    "-O0",
    "-g",
    "-Wall",
    "-Wextra",
];

/// A clang compiler of `toolchain` (`clang-19`, `clang++-14`...) with its profile runtime.
fn clang(toolchain: Toolchain, cxx: bool) -> PathBuf {
    // Debian 12 ships the profile runtime of clang 14 and later in
    // libclang-rt-N-dev, and clang 13's in libclang-common-13-dev.
    let (version, package, runtime) = match toolchain {
        Toolchain::Clang19 => ("19", "clang-19", "libclang-rt-19-dev"),
        Toolchain::Clang14 => ("14", "clang-14", "libclang-rt-14-dev"),
        Toolchain::Clang13 => ("13", "clang-13", "libclang-common-13-dev"),
        Toolchain::Rustc => unreachable!("rustc is not a clang"),
    };
    let name = format!("{}-{version}", if cxx { "clang++" } else { "clang" });
    let compiler = system_tool(&name, package);
    require_profile_runtime(&compiler, runtime);
    compiler
}

/// `fixtures/c` built by clang-19, clang-14 or clang-13, compiled from the source folder
/// with relative file names (so the coverage mapping stores a compilation dir).
pub(crate) fn c(root: &Path, toolchain: Toolchain) -> Fixture {
    let name = match toolchain {
        Toolchain::Clang19 => "c-clang19",
        Toolchain::Clang14 => "c-clang14",
        Toolchain::Clang13 => "c-clang13",
        Toolchain::Rustc => unreachable!("the C fixture is built by clang"),
    };
    let compiler = clang(toolchain, false);
    let source_dir = root.join("fixtures/c");
    let out_dir = root.join("target/fixtures").join(name);
    let sources = abs(&source_dir, &["main.c", "util.c", "shared.h"]);
    let built = build_native(&out_dir, &sources, &["main"], |dir| {
        let mut command = Command::new(&compiler);
        command
            .args(CLANG_FLAGS)
            .args(["main.c", "util.c", "-o"])
            .arg(dir.join("main"))
            .current_dir(&source_dir);
        vec![command]
    });
    let binary = built[0].clone();
    let runs = make_runs(&out_dir, &binary, C_RUNS);
    Fixture {
        name: name.into(),
        toolchain,
        source_dir,
        sources,
        binary,
        objects: Vec::new(),
        runs,
    }
}

/// `fixtures/cpp/main.cpp` built by clang++-19, given by its absolute path.
pub(crate) fn cpp(root: &Path) -> Fixture {
    let compiler = clang(Toolchain::Clang19, true);
    let source_dir = root.join("fixtures/cpp");
    let out_dir = root.join("target/fixtures/cpp");
    let sources = abs(&source_dir, &["main.cpp"]);
    let built = build_native(&out_dir, &sources, &["main"], |dir| {
        let mut command = Command::new(&compiler);
        command
            .args(CLANG_FLAGS)
            .arg(&sources[0])
            .arg("-o")
            .arg(dir.join("main"));
        vec![command]
    });
    let binary = built[0].clone();
    let runs = make_runs(&out_dir, &binary, CPP_RUNS);
    Fixture {
        name: "cpp".into(),
        toolchain: Toolchain::Clang19,
        source_dir,
        sources,
        binary,
        objects: Vec::new(),
        runs,
    }
}

/// `fixtures/sharedlib`: `libplugin.so` and `host` linked to it (rpath
/// `$ORIGIN`), both instrumented, built by clang-19 from the source folder.
pub(crate) fn sharedlib(root: &Path) -> Fixture {
    let compiler = clang(Toolchain::Clang19, false);
    let source_dir = root.join("fixtures/sharedlib");
    let out_dir = root.join("target/fixtures/sharedlib");
    let sources = abs(&source_dir, &["host.c", "plugin.c", "plugin.h"]);
    let built = build_native(&out_dir, &sources, &["host", "libplugin.so"], |dir| {
        let mut library = Command::new(&compiler);
        library
            .args(CLANG_FLAGS)
            .args([
                "-fPIC",
                "-shared",
                "-Wl,-soname,libplugin.so",
                "plugin.c",
                "-o",
            ])
            .arg(dir.join("libplugin.so"))
            .current_dir(&source_dir);
        let mut host = Command::new(&compiler);
        host.args(CLANG_FLAGS)
            .arg("host.c")
            .arg(format!("-L{}", dir.display()))
            .args(["-lplugin", "-Wl,-rpath,$ORIGIN", "-o"])
            .arg(dir.join("host"))
            .current_dir(&source_dir);
        vec![library, host]
    });
    let runs = make_runs(&out_dir, &built[0], SHAREDLIB_RUNS);
    Fixture {
        name: "sharedlib".into(),
        toolchain: Toolchain::Clang19,
        source_dir,
        sources,
        binary: built[0].clone(),
        objects: vec![built[1].clone()],
        runs,
    }
}
