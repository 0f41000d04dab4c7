//! Every example in the user documentation (README.md and docs/*.md) is
//! checked here, so that none drifts from what livecov does.
//!
//! # Markers
//!
//! Each fenced code block is checked as the HTML comment on the line right
//! before its opening fence says:
//!
//! - `<!-- run: GROUP -->` (a `sh` or `bash` block): the blocks of GROUP in
//!   one file, in document order, are one bash script, run under
//!   `set -euo pipefail` as described below. A command that fails fails the
//!   test; examples check what they show with plain commands (`grep`, `test`).
//! - `<!-- same as: PATH -->`: the block's lines appear, in a row, in the
//!   file PATH of the repository (a fixture, a manifest, a script, a
//!   Cargo.toml that the tests build or run), each line compared without its
//!   leading and trailing whitespace.
//! - `<!-- output of: GROUP -->`: what a run of GROUP (of the same file)
//!   prints. Checked loosely: GROUP must exist, and it runs.
//! - `<!-- cluster: TEST -->`: commands that need a Kubernetes cluster or
//!   a container engine (`kubectl apply`, `rollout`, `port-forward`,
//!   `podman build`, a Tekton PipelineRun), which neither this machine nor
//!   CI has: `kubectl apply` needs an API server even with
//!   `--dry-run=client`. Such a block is not run, and nothing pretends to
//!   be a cluster for it; TEST (a file of `tests/tests/`) runs its pieces
//!   without one (manifests.rs runs the manifests' containers as processes
//!   with their exact arguments). The block is checked against TEST and
//!   the files TEST reads (each `"fixtures/..."` string of TEST: a file, or
//!   a folder's files): every `livecov/PATH` it names outside `#` comments
//!   exists in the checkout; every `KIND/NAME` (`deployment/service`) is an
//!   object of those files; every `name: X` of YAML in it is a `name: X`
//!   there; every flag it gives `livecov`, with its value when spelled out,
//!   is given so there (`- --flag`, `- value` list items count), so that
//!   the commands shown are the ones the test runs. What such a doc can run
//!   is a `run:` group as usual (docs/kubernetes.md: editing the manifests,
//!   `kubectl kustomize`, which needs no cluster, and the requests and
//!   `livecov collect` against the same pieces run as processes).
//!
//! A block without a marker, in a file of [`CHECKED`], fails the test with
//! `file:line: block not checked by any test`.
//!
//! # How a group runs
//!
//! The examples are written for a user who cloned livecov into the folder
//! where they work, and installed the `livecov` command:
//!
//! - the working directory is an empty folder, `target/docs/<file>-<group>/`
//!   (emptied before each run), holding `livecov`, a symbolic link to this
//!   checkout: examples say `livecov/fixtures/service`,
//!   `livecov/agent-native/install.sh`;
//! - `livecov` on PATH is this workspace's `target/debug/livecov`
//!   (`cargo build -p livecov-cli`, which the test does first);
//! - the environment is the test's minus what the cargo running the test
//!   set for itself or a user's shell would not have (`CARGO_*` but
//!   `CARGO_HOME`, `RUSTC*`, `RUSTFLAGS`, `LLVM_PROFILE_FILE`, `LIVECOV_*`);
//! - examples that build the fixture service or liblivecov build them where
//!   the other tests do (`--target-dir`, shown in the examples), so nothing is
//!   built twice; the test builds both first, outside the groups' time
//!   limits;
//! - the script runs in a process group of its own, which is ended (SIGTERM,
//!   then SIGKILL) when the script ends: a service an example started in the
//!   background with `&` does not outlive it. Each group has [`GROUP_TIMEOUT`].
//!
//! On failure the test prints the script (each block headed by its file and
//! line) with line numbers, the failing command, and the script's stderr
//! and stdout; they are also kept in `target/docs/<file>-<group>.{sh,stdout,stderr}`.
//! `DOCS_GROUPS=quickstart-c,README cargo test -p livecov-tests --test docs`
//! runs only the groups whose `<file>-<group>` name contains one of those words.
//!
//! Besides the examples: every flag of every `livecov` subcommand is in
//! docs/cli.md (and every flag it names exists), every `LIVECOV_*` variable
//! the agents, hooks and CLI read is in docs/environment.md (and every one
//! it names is read somewhere), README.md links every checked doc, and the
//! relative links of the checked docs (anchors included) resolve.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use livecov_tests::{livecov_bin, run_checked, workspace_root};
use yaml_rust2::YamlLoader;

/// The files whose every block must carry a marker.
const CHECKED: &[&str] = &[
    "README.md",
    "docs/quickstart-rust.md",
    "docs/quickstart-c.md",
    "docs/agent.md",
    "docs/protocol.md",
    "docs/cli.md",
    "docs/environment.md",
    "docs/convert.md",
    "docs/sidecar.md",
    "docs/formats.md",
    "docs/troubleshooting.md",
    "docs/comparison.md",
    "docs/native.md",
    "docs/node.md",
    "docs/python.md",
    "docs/go.md",
    "docs/kubernetes.md",
];

/// The longest a group may run.
const GROUP_TIMEOUT: Duration = Duration::from_secs(180);

/// Groups run at once (they mostly wait for the processes they start).
const PARALLEL_GROUPS: usize = 3;

// ---------------------------------------------------------------- parsing

#[derive(Debug, Clone, PartialEq, Eq)]
enum Marker {
    Run(String),
    SameAs(String),
    OutputOf(String),
    Cluster(String),
}

/// One fenced code block.
#[derive(Debug, Clone)]
struct Block {
    /// Relative to the repository, e.g. `docs/cli.md`.
    file: String,
    /// 1-based line of the opening fence.
    line: usize,
    /// The info string's first word (`sh`, `toml`...), maybe empty.
    lang: String,
    /// The lines between the fences, without the fence's indentation.
    text: String,
    marker: Option<Marker>,
}

/// Parses a marker comment (`<!-- run: GROUP -->`...); `Err` for a comment
/// that is none of the four.
fn parse_marker(line: &str) -> Option<Result<Marker, String>> {
    let inner = line.trim().strip_prefix("<!--")?.strip_suffix("-->")?.trim();
    let (kind, value) = match inner.split_once(':') {
        Some((k, v)) => (k.trim(), v.trim()),
        None => return Some(Err(format!("unknown marker {line:?} (run:, same as:, output of:, cluster:)"))),
    };
    let valid_group = |g: &str| !g.is_empty() && g.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    let valid_path = |p: &str| !p.is_empty() && !p.contains("..") && !p.starts_with('/');
    Some(match kind {
        "run" if valid_group(value) => Ok(Marker::Run(value.to_owned())),
        "output of" if valid_group(value) => Ok(Marker::OutputOf(value.to_owned())),
        "same as" if valid_path(value) => Ok(Marker::SameAs(value.to_owned())),
        "cluster" if valid_path(value) => Ok(Marker::Cluster(value.to_owned())),
        _ => Err(format!(
            "unknown or malformed marker {line:?} (run: GROUP, same as: PATH, output of: GROUP, cluster: TEST)"
        )),
    })
}

/// The fenced blocks of a markdown text, and what is wrong with its fences
/// or markers.
fn parse_blocks(file: &str, text: &str) -> (Vec<Block>, Vec<String>) {
    let lines: Vec<&str> = text.lines().collect();
    let mut blocks = Vec::new();
    let mut problems = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let indent = line.len() - line.trim_start().len();
        let trimmed = line.trim_start();
        let fence_char = if trimmed.starts_with("```") {
            '`'
        } else if trimmed.starts_with("~~~") {
            '~'
        } else {
            i += 1;
            continue;
        };
        let fence_len = trimmed.chars().take_while(|&c| c == fence_char).count();
        let lang = trimmed[fence_len..].split_whitespace().next().unwrap_or("").to_owned();
        let marker = match i.checked_sub(1).and_then(|p| parse_marker(lines[p])) {
            Some(Ok(m)) => Some(m),
            Some(Err(e)) => {
                problems.push(format!("{file}:{}: {e}", i));
                None
            }
            None => None,
        };
        let start = i;
        let mut body = Vec::new();
        i += 1;
        let mut closed = false;
        while i < lines.len() {
            let l = lines[i];
            let t = l.trim_start();
            if t.starts_with(&fence_char.to_string().repeat(fence_len)) && t.trim_end().chars().all(|c| c == fence_char) {
                closed = true;
                i += 1;
                break;
            }
            // Content lines lose the fence's indentation (blocks in lists).
            let cut = l.len() - l.trim_start().len();
            body.push(&l[cut.min(indent)..]);
            i += 1;
        }
        if !closed {
            problems.push(format!("{file}:{}: code block never closed", start + 1));
        }
        blocks.push(Block { file: file.to_owned(), line: start + 1, lang, text: body.join("\n"), marker });
    }
    (blocks, problems)
}

/// Whether `needle`'s lines appear in a row among `haystack`'s, each
/// compared without leading and trailing whitespace (leading and trailing
/// blank lines of `needle` do not count).
fn contains_lines(haystack: &str, needle: &str) -> bool {
    fn trim(s: &str) -> Vec<&str> {
        s.lines().map(str::trim).collect()
    }
    let hay = trim(haystack);
    let mut want = trim(needle);
    while want.first() == Some(&"") {
        want.remove(0);
    }
    while want.last() == Some(&"") {
        want.pop();
    }
    !want.is_empty() && hay.windows(want.len()).any(|w| w == want.as_slice())
}

/// What is wrong with the markers of one file's blocks: unmarked blocks
/// (when `enforce` is set), `same as` text missing from its file, `output
/// of` a group the file does not run, `run` on a block that is not shell,
/// `cluster` blocks that drifted from their test.
fn check_blocks(blocks: &[Block], root: &Path, enforce: bool) -> Vec<String> {
    let mut problems = Vec::new();
    let groups: BTreeSet<&str> = blocks
        .iter()
        .filter_map(|b| match &b.marker {
            Some(Marker::Run(g)) => Some(g.as_str()),
            _ => None,
        })
        .collect();
    for b in blocks {
        let at = format!("{}:{}", b.file, b.line);
        match &b.marker {
            None if enforce => problems.push(format!("{at}: block not checked by any test")),
            None => {}
            Some(Marker::Run(_)) if !matches!(b.lang.as_str(), "sh" | "bash" | "shell") => {
                problems.push(format!("{at}: a `run:` block must be sh or bash, not {:?}", b.lang));
            }
            Some(Marker::Run(_)) => {}
            Some(Marker::SameAs(path)) => match std::fs::read_to_string(root.join(path)) {
                Ok(text) if contains_lines(&text, &b.text) => {}
                Ok(_) => problems.push(format!("{at}: block text not found in {path}")),
                Err(e) => problems.push(format!("{at}: same as {path}: {e}")),
            },
            Some(Marker::OutputOf(g)) if !groups.contains(g.as_str()) => {
                problems.push(format!("{at}: output of group {g:?}, which {} does not run", b.file));
            }
            Some(Marker::OutputOf(_)) => {}
            Some(Marker::Cluster(test)) => problems.extend(check_cluster_block(b, root, test)),
        }
    }
    problems
}

// ---------------------------------------------------------------- cluster blocks

/// The kinds of `KIND/NAME` that kubectl commands of a `cluster:` block
/// name, with their `kind:` in the manifests.
const OBJECT_KINDS: &[(&str, &str)] = &[
    ("deployment", "Deployment"),
    ("service", "Service"),
    ("statefulset", "StatefulSet"),
    ("daemonset", "DaemonSet"),
    ("job", "Job"),
    ("secret", "Secret"),
    ("configmap", "ConfigMap"),
];

/// The files a test reads: the test itself, and each `"fixtures/..."`
/// string of it that is a file, or a folder (its files). As (relative path,
/// text), and the test's `fixtures/...` strings (for messages).
fn test_inputs(root: &Path, test: &str, test_text: &str) -> (Vec<(String, String)>, Vec<String>) {
    let mut inputs = vec![(test.to_owned(), test_text.to_owned())];
    let mut named = Vec::new();
    for literal in between(test_text, "\"fixtures/", "\"") {
        if literal.is_empty() || !literal.chars().all(|c| c.is_ascii_alphanumeric() || "/._-".contains(c)) {
            continue;
        }
        named.push(format!("fixtures/{literal}"));
        let path = root.join("fixtures").join(literal);
        let files: Vec<PathBuf> = if path.is_dir() {
            let mut files: Vec<PathBuf> =
                std::fs::read_dir(&path).into_iter().flatten().flatten().map(|e| e.path()).filter(|p| p.is_file()).collect();
            files.sort();
            files
        } else {
            vec![path]
        };
        for file in files {
            let rel = file.strip_prefix(root).unwrap_or(&file).display().to_string();
            if inputs.iter().any(|(r, _)| *r == rel) {
                continue;
            }
            if let Ok(text) = std::fs::read_to_string(&file) {
                inputs.push((rel, text));
            }
        }
    }
    (inputs, named)
}

/// The words of a text as flags and values appear in manifests, scripts
/// and Rust arrays: split at blanks, brackets, commas and quotes, YAML's
/// `-` list markers dropped, `--flag=value` as two words.
fn arg_words(text: &str) -> Vec<String> {
    let mut words = Vec::new();
    for word in text.split(|c: char| c.is_whitespace() || "[](),\"'".contains(c)).filter(|w| !w.is_empty() && *w != "-") {
        match word.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => words.extend([flag.to_owned(), value.to_owned()]),
            _ => words.push(word.to_owned()),
        }
    }
    words
}

/// A line without its shell comment (from a `#` that starts a word).
fn without_comment(line: &str) -> &str {
    let bytes = line.as_bytes();
    (0..bytes.len()).find(|&i| bytes[i] == b'#' && (i == 0 || bytes[i - 1].is_ascii_whitespace())).map_or(line, |i| &line[..i])
}

/// The flags a block gives `livecov`, each with its value when the block
/// spells one out (not `...`, not a shell expansion): the words after
/// `livecov SUBCOMMAND` on its line, and on the lines after it that go on
/// with a flag (a command split over lines, in text or in a drawing).
fn livecov_flags(text: &str) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    let mut in_command = false;
    for line in text.lines() {
        let words: Vec<&str> = without_comment(line).split_whitespace().filter(|w| *w != "|" && *w != "\\").collect();
        let start = words.windows(2).position(|w| w[0] == "livecov" && w[1].chars().all(|c| c.is_ascii_lowercase()));
        let from = match start {
            Some(i) => {
                in_command = true;
                i + 2
            }
            None if in_command && words.first().is_some_and(|w| w.starts_with("--")) => 0,
            None => {
                in_command = false;
                continue;
            }
        };
        for (i, word) in words.iter().enumerate().skip(from) {
            if !word.starts_with("--") || word.len() < 3 {
                continue;
            }
            let flag = word.trim_end_matches([',', ';', ')', '.']);
            let value = words
                .get(i + 1)
                .filter(|v| flag.len() == word.len() && !v.starts_with('-') && !v.starts_with('<'))
                .filter(|v| !v.contains("...") && !v.contains('$') && !v.contains('"'))
                .map(|v| v.to_string());
            out.push((flag.to_owned(), value));
        }
    }
    out
}

/// What is wrong with a `cluster:` block (see the module docs).
fn check_cluster_block(b: &Block, root: &Path, test: &str) -> Vec<String> {
    let at = format!("{}:{}", b.file, b.line);
    let is_test = test.starts_with("tests/tests/") && test.ends_with(".rs");
    let test_text = match std::fs::read_to_string(root.join(test)) {
        Ok(text) if is_test => text,
        Ok(_) => return vec![format!("{at}: cluster: {test} is not a test (tests/tests/*.rs)")],
        Err(e) => return vec![format!("{at}: cluster: {test}: {e}")],
    };
    let (inputs, named) = test_inputs(root, test, &test_text);
    let read = named.join(", ");
    let mut problems = Vec::new();

    let words: Vec<&str> = b.text.lines().flat_map(|l| without_comment(l).split_whitespace()).collect();
    for word in &words {
        let word = word.trim_matches(['"', '\'']).trim_end_matches([',', ';', ')']);
        if let Some(path) = word.strip_prefix("livecov/") {
            if !root.join(path).exists() {
                problems.push(format!("{at}: {word} is not in the checkout"));
            }
        }
    }

    let mut objects = BTreeSet::new();
    for (file, text) in inputs.iter().filter(|(p, _)| p.ends_with(".yaml") || p.ends_with(".yml")) {
        let docs = YamlLoader::load_from_str(text).unwrap_or_else(|e| panic!("{file}: {e}"));
        for doc in docs {
            if let (Some(kind), Some(name)) = (doc["kind"].as_str(), doc["metadata"]["name"].as_str()) {
                objects.insert((kind.to_owned(), name.to_owned()));
            }
        }
    }
    for word in &words {
        let Some((kind, name)) = word.split_once('/') else { continue };
        let Some((_, kind)) = OBJECT_KINDS.iter().find(|(k, _)| *k == kind) else { continue };
        if !objects.contains(&(kind.to_string(), name.to_owned())) {
            problems.push(format!("{at}: {word}: no {kind} {name} in the files {test} reads ({read})"));
        }
    }

    let yaml_name = |line: &str| line.trim().trim_start_matches("- ").strip_prefix("name:").map(|n| n.trim().to_owned());
    let names: BTreeSet<String> = inputs.iter().flat_map(|(_, text)| text.lines().filter_map(yaml_name)).collect();
    for name in b.text.lines().filter_map(yaml_name) {
        if !names.contains(&name) {
            problems.push(format!("{at}: name: {name} is no `name:` in the files {test} reads ({read})"));
        }
    }

    let given: Vec<Vec<String>> = inputs.iter().map(|(_, text)| arg_words(text)).collect();
    for (flag, value) in livecov_flags(&b.text) {
        let found = given.iter().any(|w| match &value {
            Some(v) => w.windows(2).any(|p| p[0] == flag && p[1] == *v),
            None => w.contains(&flag),
        });
        if !found {
            let shown = value.map_or(flag.clone(), |v| format!("{flag} {v}"));
            problems.push(format!("{at}: livecov ... {shown}: not given so in {test} or the files it reads ({read})"));
        }
    }
    problems
}

/// README.md and every docs/*.md, relative to the repository.
fn doc_files(root: &Path) -> Vec<String> {
    let mut files = vec!["README.md".to_owned()];
    let mut docs: Vec<String> = std::fs::read_dir(root.join("docs"))
        .expect("read docs/")
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

fn read(root: &Path, file: &str) -> String {
    std::fs::read_to_string(root.join(file)).unwrap_or_else(|e| panic!("read {file}: {e}"))
}

/// Every block of every doc file, and the problems of their markers.
fn all_blocks(root: &Path) -> (Vec<Block>, Vec<String>) {
    let mut blocks = Vec::new();
    let mut problems = Vec::new();
    for file in doc_files(root) {
        let (b, p) = parse_blocks(&file, &read(root, &file));
        problems.extend(p);
        problems.extend(check_blocks(&b, root, CHECKED.contains(&file.as_str())));
        blocks.extend(b);
    }
    (blocks, problems)
}

// ---------------------------------------------------------------- static checks

#[test]
fn every_block_is_checked() {
    let root = workspace_root();
    for file in CHECKED {
        assert!(root.join(file).is_file(), "{file} is in CHECKED but does not exist");
    }
    let (blocks, problems) = all_blocks(&root);
    assert!(problems.is_empty(), "{} problem(s) with the docs' examples:\n{}", problems.len(), problems.join("\n"));
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for b in blocks.iter().filter(|b| b.marker.is_some()) {
        *counts.entry(&b.file).or_default() += 1;
    }
    eprintln!("checked blocks per file: {counts:?}");
}

#[test]
fn the_checker_reports_unmarked_blocks_and_missing_text() {
    let root = workspace_root();
    let doc = "# A doc\n\n```sh\necho unchecked\n```\n\n<!-- same as: Makefile -->\n```make\nthis line is in no Makefile\n```\n\n\
               <!-- same as: Makefile -->\n```make\ndeps:\n\t@tests/scripts/install-deps.sh\n```\n\n\
               <!-- output of: nowhere -->\n```\nx\n```\n\n<!-- runs: typo -->\n```sh\ntrue\n```\n";
    let (blocks, parse_problems) = parse_blocks("docs/example.md", doc);
    assert_eq!(blocks.len(), 5);
    let problems = check_blocks(&blocks, &root, true);
    let all = [parse_problems.clone(), problems.clone()].concat().join("\n");
    assert!(problems.contains(&"docs/example.md:3: block not checked by any test".to_owned()), "{all}");
    assert!(problems.contains(&"docs/example.md:8: block text not found in Makefile".to_owned()), "{all}");
    assert!(!all.contains("example.md:13"), "the Makefile's real lines were not found: {all}");
    assert!(problems.iter().any(|p| p.starts_with("docs/example.md:19: output of group \"nowhere\"")), "{all}");
    assert!(parse_problems.iter().any(|p| p.starts_with("docs/example.md:23: unknown or malformed marker")), "{all}");
    // The marker-less block at line 23 also counts as unchecked.
    assert!(problems.contains(&"docs/example.md:24: block not checked by any test".to_owned()), "{all}");
    // Not enforced (a file not in CHECKED yet): only the wrong markers.
    let lenient = check_blocks(&blocks, &root, false);
    assert!(!lenient.iter().any(|p| p.contains("not checked")), "{lenient:?}");
    assert!(lenient.iter().any(|p| p.contains("not found in Makefile")), "{lenient:?}");
}

#[test]
fn the_checker_reports_cluster_blocks_that_drift() {
    let root = workspace_root();
    // A drawing's command goes on over lines, up to a line that does not
    // start with a flag; `...` and `$VAR` values are not compared, only
    // their flags; short options are not looked at.
    let drawing = "| livecov sidecar --dir /cov    |\n|   --token-file .../pod-token |\n+----+\n--poll-interval 9\n\
                   curl \"$agg\", livecov collect --target, the Task\nlivecov collect --target \"http://$agg\" -o out\n";
    let some = |s: &str| Some(s.to_owned());
    assert_eq!(
        livecov_flags(drawing),
        [
            ("--dir".to_owned(), some("/cov")),
            ("--token-file".to_owned(), None),
            ("--target".to_owned(), None),
            ("--target".to_owned(), None),
        ]
    );

    let doc = "<!-- cluster: tests/tests/manifests.rs -->\n```sh\n\
               kubectl -n ci apply -f livecov/fixtures/tekton/pipeline.yaml   # livecov/not/checked in a comment\n\
               kubectl -n ci rollout status deployment/livecov-aggregator\n\
               kubectl -n ci port-forward service/service-coverage 9464:9464\n\
               livecov sidecar --replicas srv:_coverage._tcp.service-coverage --poll-interval 15 --token-file \"$F\"\n\
               kubectl create -f - <<'EOF'\nspec:\n  pipelineRef:\n    name: e2e-with-coverage\nEOF\n```\n\n\
               <!-- cluster: tests/tests/manifests.rs -->\n```sh\n\
               kubectl -n ci apply -f livecov/fixtures/tekton/no-such.yaml\n\
               kubectl -n ci rollout status deployment/no-such-deployment\n\
               kubectl -n ci port-forward service/livecov-aggregator-typo 9464\n\
               livecov sidecar --replicas srv:_coverage._tcp.service-coverage --poll-interval 16 --no-such-flag\n\
               kubectl create -f - <<'EOF'\nspec:\n  pipelineRef:\n    name: no-such-pipeline\nEOF\n```\n\n\
               <!-- cluster: tests/tests/no-such-test.rs -->\n```sh\nkubectl get pods\n```\n\n\
               <!-- cluster: fixtures/k8s/service.yaml -->\n```sh\nkubectl get pods\n```\n";
    let (blocks, parse_problems) = parse_blocks("docs/example.md", doc);
    assert!(parse_problems.is_empty(), "{parse_problems:?}");
    assert_eq!(blocks.len(), 4);
    assert!(blocks.iter().all(|b| matches!(b.marker, Some(Marker::Cluster(_)))), "{blocks:?}");
    let problems = check_blocks(&blocks, &root, true);
    let all = problems.join("\n");
    assert!(!all.contains("example.md:2:"), "the block that matches the manifests was refused: {all}");
    for expected in [
        "docs/example.md:15: livecov/fixtures/tekton/no-such.yaml is not in the checkout",
        "docs/example.md:15: deployment/no-such-deployment: no Deployment no-such-deployment in the files",
        "docs/example.md:15: service/livecov-aggregator-typo: no Service livecov-aggregator-typo in the files",
        "docs/example.md:15: livecov ... --poll-interval 16: not given so in tests/tests/manifests.rs",
        "docs/example.md:15: livecov ... --no-such-flag: not given so in tests/tests/manifests.rs",
        "docs/example.md:15: name: no-such-pipeline is no `name:` in the files",
        "docs/example.md:28: cluster: tests/tests/no-such-test.rs: ",
        "docs/example.md:33: cluster: fixtures/k8s/service.yaml is not a test",
    ] {
        assert!(problems.iter().any(|p| p.starts_with(expected)), "missing {expected:?} in:\n{all}");
    }
    assert_eq!(problems.len(), 8, "{all}");
    assert!(matches!(parse_marker("<!-- cluster: /etc/passwd -->"), Some(Err(_))));
}

/// `## livecov <cmd>` sections of docs/cli.md: the `--flags` each names.
fn cli_md_sections(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut sections: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        if let Some(title) = line.strip_prefix("## ") {
            current = title
                .trim_matches('`')
                .strip_prefix("livecov ")
                .and_then(|rest| rest.split_whitespace().next())
                .map(str::to_owned);
            if let Some(cmd) = &current {
                sections.entry(cmd.clone()).or_default();
            }
            continue;
        }
        if let Some(cmd) = &current {
            sections.get_mut(cmd).expect("entered above").extend(long_flags(line));
        }
    }
    sections
}

/// The `--long-flags` in a text.
fn long_flags(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(pos) = text[i..].find("--") {
        let start = i + pos;
        let before_ok = start == 0 || !(bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'-');
        let mut end = start + 2;
        while end < bytes.len() && (bytes[end].is_ascii_lowercase() || bytes[end].is_ascii_digit() || bytes[end] == b'-') {
            end += 1;
        }
        if before_ok && end > start + 2 && bytes[start + 2].is_ascii_lowercase() {
            out.insert(text[start..end].trim_end_matches('-').to_owned());
        }
        i = end.max(start + 2);
    }
    out
}

fn help(args: &[&str]) -> String {
    let out = run_checked(Command::new(livecov_bin()).args(args).arg("--help"), &format!("livecov {args:?} --help"));
    String::from_utf8(out.stdout).expect("help is UTF-8")
}

#[test]
fn cli_md_names_every_flag_of_every_subcommand() {
    let root = workspace_root();
    let sections = cli_md_sections(&read(&root, "docs/cli.md"));
    let top = help(&[]);
    let commands: Vec<String> = top
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .filter(|c| c != "help")
        .collect();
    assert!(commands.len() >= 6, "`livecov --help` lists {commands:?}");
    let mut problems = Vec::new();
    for cmd in &commands {
        let Some(documented) = sections.get(cmd) else {
            problems.push(format!("docs/cli.md has no `## livecov {cmd}` section"));
            continue;
        };
        // The option lines (`  -o, --output <OUT>`), not the prose, which
        // may name other subcommands' flags.
        let mut flags: BTreeSet<String> = help(&[cmd])
            .lines()
            .filter(|l| l.trim_start().starts_with('-'))
            .filter_map(|l| long_flags(l).into_iter().next())
            .collect();
        flags.remove("--help");
        for flag in flags.difference(documented) {
            problems.push(format!("docs/cli.md, livecov {cmd}: {flag} (in --help) is not mentioned"));
        }
        for flag in documented.difference(&flags) {
            if flag != "--help" {
                problems.push(format!("docs/cli.md, livecov {cmd}: {flag} is not a flag of livecov {cmd}"));
            }
        }
    }
    for cmd in sections.keys().filter(|c| !commands.contains(c)) {
        problems.push(format!("docs/cli.md documents `livecov {cmd}`, which `livecov --help` does not list"));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The `LIVECOV_*` names read from the environment somewhere in the code:
/// literal names, and the names the agents' configuration readers build
/// from a key (`env("flush_secs")` in Rust, `var("DIR")` in Python,
/// `get('DIR')` in the Node hook).
fn variables_in_code(root: &Path) -> BTreeMap<String, String> {
    let mut files = Vec::new();
    for dir in ["agent-rust/src", "agent-native/src", "agent-native/include", "sidecar/src", "hooks"] {
        collect_files(&root.join(dir), &mut files);
    }
    // Names the C header defines (status codes, version macros, its include
    // guard) are not environment variables; nor the status name for values
    // outside the enum.
    let header = read(root, "agent-native/include/livecov.h");
    let mut not_variables: BTreeSet<String> = ["LIVECOV_UNKNOWN".to_owned()].into();
    for line in strip_c_comments(&header).lines() {
        not_variables.extend(names_with_prefix(line, "LIVECOV_"));
    }
    let mut found = BTreeMap::new();
    for path in files {
        let Ok(text) = std::fs::read_to_string(&path) else { continue };
        let rel = path.strip_prefix(root).unwrap_or(&path).display().to_string();
        for name in names_with_prefix(&text, "LIVECOV_") {
            // A constant of the Node hook, not read from the environment.
            let is_constant = text.contains(&format!("const {name} ="));
            if !not_variables.contains(&name) && !is_constant {
                found.entry(name).or_insert_with(|| rel.clone());
            }
        }
        for (open, close, upper) in [("env(\"", "\")", true), ("var(\"", "\")", true), ("get('", "')", false)] {
            for key in between(&text, open, close) {
                let ok = !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                if ok && (upper || key.chars().all(|c| !c.is_ascii_lowercase())) {
                    found.entry(format!("LIVECOV_{}", key.to_ascii_uppercase())).or_insert_with(|| rel.clone());
                }
            }
        }
    }
    found
}

fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let path = e.path();
        let name = e.file_name();
        if name == "node_modules" || name == "__pycache__" || name == "target" {
            continue;
        }
        if path.is_dir() {
            collect_files(&path, out);
        } else {
            out.push(path);
        }
    }
}

fn strip_c_comments(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("/*") {
        out.push_str(&rest[..start]);
        rest = rest[start..].find("*/").map_or("", |end| &rest[start + end + 2..]);
    }
    out.push_str(rest);
    out
}

/// Words made of `A-Z0-9_` starting with `prefix` (and at least one more
/// letter).
fn names_with_prefix(text: &str, prefix: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut i = 0;
    while let Some(pos) = text[i..].find(prefix) {
        let start = i + pos;
        let before = text[..start].chars().next_back();
        let mut end = start + prefix.len();
        let bytes = text.as_bytes();
        while end < bytes.len() && (bytes[end].is_ascii_uppercase() || bytes[end].is_ascii_digit() || bytes[end] == b'_') {
            end += 1;
        }
        let word_start = before.is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
        let name = text[start..end].trim_end_matches('_');
        if word_start && name.len() > prefix.len() {
            out.insert(name.to_owned());
        }
        i = end.max(start + 1);
    }
    out
}

/// The strings between `open` and the next `close`.
fn between<'a>(text: &'a str, open: &str, close: &str) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(open) {
        rest = &rest[start + open.len()..];
        match rest.find(close) {
            Some(end) => {
                out.push(&rest[..end]);
                rest = &rest[end..];
            }
            None => break,
        }
    }
    out
}

#[test]
fn environment_md_names_every_variable() {
    let root = workspace_root();
    let doc = read(&root, "docs/environment.md");
    let documented = names_with_prefix(&doc, "LIVECOV_");
    let in_code = variables_in_code(&root);
    for name in ["LIVECOV_DIR", "LIVECOV_FLUSH_SECS", "LIVECOV_SIDECAR_TOKEN", "LIVECOV_VERBOSE"] {
        assert!(in_code.contains_key(name), "the scan of the code misses {name}: {in_code:?}");
    }
    let mut problems = Vec::new();
    for (name, file) in &in_code {
        if !documented.contains(name) {
            problems.push(format!("{name} (read in {file}) is not in docs/environment.md"));
        }
    }
    for name in documented.iter().filter(|n| !in_code.contains_key(*n)) {
        problems.push(format!("docs/environment.md names {name}, which no agent, hook or command reads"));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Relative links `](path#anchor)` of a markdown text: (path, anchor),
/// the path empty for a link within the page.
fn relative_links(text: &str) -> Vec<(String, Option<String>)> {
    between(text, "](", ")")
        .into_iter()
        .filter(|l| !l.contains("://") && !l.starts_with("mailto:") && !l.is_empty())
        .map(|l| match l.split_once('#') {
            Some((path, anchor)) => (path.to_owned(), Some(anchor.to_owned())),
            None => (l.to_owned(), None),
        })
        .collect()
}

/// The anchors GitHub makes of a page's headings: lower case, punctuation
/// but `-` and `_` dropped, spaces as `-`.
fn heading_anchors(text: &str) -> BTreeSet<String> {
    let mut anchors = BTreeSet::new();
    let mut in_block = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
        } else if !in_block && line.starts_with('#') {
            let title = line.trim_start_matches('#').trim().to_lowercase();
            let slug: String = title
                .chars()
                .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
                .map(|c| if c == ' ' { '-' } else { c })
                .collect();
            anchors.insert(slug);
        }
    }
    anchors
}

#[test]
fn readme_links_every_checked_doc_and_links_resolve() {
    let root = workspace_root();
    let readme = read(&root, "README.md");
    let readme_links = relative_links(&readme);
    let mut problems = Vec::new();
    for file in CHECKED.iter().filter(|f| f.starts_with("docs/")) {
        if !readme_links.iter().any(|(path, _)| path == file) {
            problems.push(format!("README.md does not link {file}"));
        }
    }
    for file in CHECKED {
        let dir = Path::new(file).parent().unwrap_or(Path::new(""));
        for (path, anchor) in relative_links(&read(&root, file)) {
            let target = if path.is_empty() { root.join(file) } else { root.join(dir).join(&path) };
            if !target.exists() {
                problems.push(format!("{file}: link to {path}, which does not exist"));
                continue;
            }
            let Some(anchor) = anchor else { continue };
            let is_page = target.extension().is_some_and(|e| e == "md");
            if is_page && !heading_anchors(&std::fs::read_to_string(&target).unwrap_or_default()).contains(&anchor) {
                problems.push(format!("{file}: link to {path}#{anchor}, a heading that does not exist"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

// ---------------------------------------------------------------- running

/// One `run:` group: its blocks, in document order.
struct Group {
    file: String,
    name: String,
    blocks: Vec<Block>,
}

impl Group {
    /// `<file stem>-<group>`, e.g. `quickstart-c-c`, `README-demo`.
    fn id(&self) -> String {
        let stem = Path::new(&self.file).file_stem().and_then(|s| s.to_str()).unwrap_or("doc");
        format!("{stem}-{}", self.name)
    }

    fn script(&self) -> String {
        let mut s = String::from(
            "set -euo pipefail\ntrap 'echo \"docs: line $LINENO: exit status $?: $BASH_COMMAND\" >&2' ERR\n",
        );
        for b in &self.blocks {
            s.push_str(&format!("\n# ---- {}:{}\n", b.file, b.line));
            s.push_str(&b.text);
            s.push('\n');
        }
        s
    }
}

fn groups(blocks: &[Block]) -> Vec<Group> {
    let mut out: Vec<Group> = Vec::new();
    for b in blocks {
        let Some(Marker::Run(name)) = &b.marker else { continue };
        match out.iter_mut().find(|g| g.file == b.file && &g.name == name) {
            Some(g) => g.blocks.push(b.clone()),
            None => out.push(Group { file: b.file.clone(), name: name.clone(), blocks: vec![b.clone()] }),
        }
    }
    out
}

/// What the examples build, built first so that the groups' time limits
/// measure the examples: the `livecov` command, the fixture service, and
/// liblivecov, each where the examples (and the other tests) build them.
fn prepare(root: &Path) {
    livecov_bin();
    livecov_tests::service::service_bin();
    let mut cargo = plain_command("cargo");
    cargo
        .args(["build", "--quiet", "-p", "livecov-native", "--profile", "release-native", "--target-dir"])
        .arg(root.join("target/fixtures/native/cargo"))
        .current_dir(root);
    run_checked(&mut cargo, "cargo build -p livecov-native --profile release-native");
}

/// A command with the environment of a user's shell (see the module docs).
fn plain_command(program: &str) -> Command {
    let mut cmd = Command::new(program);
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        let drop = (name.starts_with("CARGO") && name != "CARGO_HOME")
            || name.starts_with("__CARGO")
            || name.starts_with("RUSTC")
            || name.starts_with("RUSTDOC")
            || name == "RUSTFLAGS"
            || name == "LLVM_PROFILE_FILE"
            || name.starts_with("LIVECOV_");
        if drop {
            cmd.env_remove(&*name);
        }
    }
    cmd
}

/// The processes of process group `pgid` that have not ended (zombies
/// count as ended: nothing may reap them but their parent).
fn group_members(pgid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else { return out };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        // pid (comm) state ppid pgrp ...
        let Some((_, rest)) = stat.rsplit_once(')') else { continue };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.len() > 2 && fields[0] != "Z" && fields[2].parse() == Ok(pgid) {
            out.push(pid);
        }
    }
    out
}

/// Ends every process of the group: SIGTERM, then SIGKILL after 5 s.
fn end_group(pgid: i32) {
    // Safety: signals to a process group this test created.
    unsafe { libc::killpg(pgid, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(5);
    while !group_members(pgid).is_empty() {
        if Instant::now() > deadline {
            unsafe { libc::killpg(pgid, libc::SIGKILL) };
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The last `n` lines of a text.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Runs a group; `Err` with what a reader needs to see why it failed.
fn run_group(root: &Path, group: &Group) -> Result<Duration, String> {
    let base = root.join("target/docs");
    let id = group.id();
    let dir = base.join(&id);
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(|e| format!("cannot empty {}: {e}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    std::os::unix::fs::symlink(root, dir.join("livecov")).map_err(|e| format!("cannot link the checkout: {e}"))?;
    let script = group.script();
    let script_path = base.join(format!("{id}.sh"));
    let (out_path, err_path) = (base.join(format!("{id}.stdout")), base.join(format!("{id}.stderr")));
    std::fs::write(&script_path, &script).map_err(|e| format!("cannot write {}: {e}", script_path.display()))?;
    let file = |p: &Path| std::fs::File::create(p).map_err(|e| format!("cannot create {}: {e}", p.display()));

    let path = std::env::join_paths(
        std::iter::once(root.join("target/debug")).chain(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())),
    )
    .expect("PATH");
    let mut cmd = plain_command("bash");
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let started = Instant::now();
    let mut child = cmd
        .arg(&script_path)
        .current_dir(&dir)
        .env("PATH", path)
        .stdin(Stdio::null())
        .stdout(file(&out_path)?)
        .stderr(file(&err_path)?)
        .spawn()
        .map_err(|e| format!("cannot run bash: {e}"))?;
    let pgid = child.id() as i32;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if started.elapsed() > GROUP_TIMEOUT => break None,
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return Err(format!("waiting for bash: {e}")),
        }
    };
    let elapsed = started.elapsed();
    end_group(pgid);
    let _ = child.kill();
    let _ = child.wait();
    let outcome = match status {
        Some(s) if s.success() => return Ok(elapsed),
        Some(s) => format!("failed ({s})"),
        None => format!("did not finish within {} s", GROUP_TIMEOUT.as_secs()),
    };
    let numbered: String = script.lines().enumerate().map(|(n, l)| format!("{:4}  {l}\n", n + 1)).collect();
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    Err(format!(
        "==== {} group {:?} {outcome}, in {}\n---- script ({})\n{numbered}---- stderr (last lines)\n{}\n---- stdout (last lines)\n{}\n",
        group.file,
        group.name,
        dir.display(),
        script_path.display(),
        tail(&stderr, 80),
        tail(&stdout, 40)
    ))
}

#[test]
fn every_run_group_succeeds() {
    let root = workspace_root();
    let (blocks, _) = all_blocks(&root);
    let only: Vec<String> = std::env::var("DOCS_GROUPS")
        .map(|v| v.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned).collect())
        .unwrap_or_default();
    let groups: Vec<Group> =
        groups(&blocks).into_iter().filter(|g| only.is_empty() || only.iter().any(|w| g.id().contains(w.as_str()))).collect();
    assert!(!groups.is_empty(), "no `run:` group to run (DOCS_GROUPS={only:?})");
    prepare(&root);

    let queue = std::sync::Mutex::new(groups.iter().collect::<Vec<_>>());
    let results = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..PARALLEL_GROUPS {
            scope.spawn(|| loop {
                let Some(group) = queue.lock().expect("queue").pop() else { return };
                let result = run_group(&root, group);
                results.lock().expect("results").push((group.id(), result));
            });
        }
    });
    let results = results.into_inner().expect("results");
    let mut failures = Vec::new();
    for (id, result) in &results {
        match result {
            Ok(took) => eprintln!("docs group {id}: ok in {:.1} s", took.as_secs_f64()),
            Err(report) => failures.push(report.clone()),
        }
    }
    assert!(failures.is_empty(), "{} of {} groups failed:\n{}", failures.len(), results.len(), failures.join("\n"));
}
