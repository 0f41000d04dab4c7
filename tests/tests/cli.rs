//! `livecov merge`, `livecov dump` and `livecov reset`, end to end: the
//! `livecov` binary against LCOV files and against the fixture service
//! (fixtures/service) running with the agent, on its Unix socket and on TCP
//! with a token; and against targets that are not there.

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use livecov_tests::disk::SmallDisk;
use livecov_tests::lcov::lines_hit;
use livecov_tests::service::{scratch, Service};
use livecov_tests::livecov_bin;

// ---------------------------------------------------------------- the binaries

/// Runs `livecov ARGS` with `stdin`; no token from the environment.
fn livecov(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(livecov_bin())
        .args(args)
        .env_remove("LIVECOV_TOKEN")
        .env_remove("LIVECOV_TOKEN_FILE")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run livecov");
    let mut input = child.stdin.take().expect("stdin");
    let stdin = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&stdin);
    });
    let out = child.wait_with_output().expect("wait for livecov");
    writer.join().expect("stdin writer");
    out
}

fn ok(args: &[&str]) -> Output {
    let out = livecov(args, b"");
    assert!(out.status.success(), "livecov {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    out
}

/// Runs a command that must fail; returns its standard error.
fn fails(args: &[&str]) -> String {
    let out = livecov(args, b"");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "livecov {args:?} succeeded; stderr: {stderr}");
    assert!(out.stdout.is_empty(), "livecov {args:?} wrote to stdout on failure");
    stderr
}

// The fixture service with the agent, in `target/tmp/cli/<name>-<pid>`.

fn start(name: &str, env: &[(&str, &str)]) -> Service {
    Service::start("cli", name, &[], env)
}

/// The agent's socket, as livecov takes it.
fn socket_arg(s: &Service) -> String {
    s.socket().to_str().expect("a UTF-8 path").to_owned()
}

fn wait_for<T>(f: impl FnMut() -> Option<T>) -> T {
    livecov_tests::wait_for("the agent", Duration::from_millis(20), f)
}

// ---------------------------------------------------------------- LCOV

/// FNDA counts of the function whose (mangled) name contains `function`, in
/// files ending with `suffix`, per test name.
fn function_count(lcov: &str, suffix: &str, function: &str) -> u64 {
    let mut file = String::new();
    let mut total = None;
    for line in lcov.lines() {
        if let Some(f) = line.strip_prefix("SF:") {
            file = f.to_owned();
        } else if let Some(fnda) = line.strip_prefix("FNDA:") {
            let (c, name) = fnda.split_once(',').expect("FNDA:count,name");
            if file.ends_with(suffix) && name.contains(function) {
                *total.get_or_insert(0) += c.parse::<u64>().expect("count");
            }
        }
    }
    total.unwrap_or_else(|| panic!("no function {function} in {suffix}"))
}

const FIB: &str = "handlers3fib";

// ---------------------------------------------------------------- merge

#[test]
fn merge_reads_files_and_stdin_and_writes_atomically() {
    let dir = scratch("cli", "merge");
    let a = dir.join("a.lcov");
    let b = dir.join("b.lcov");
    std::fs::write(&a, "TN:t\nSF:/s/x.rs\nFN:1,f\nFNDA:2,f\nDA:1,2\nDA:2,0\nend_of_record\n").unwrap();
    std::fs::write(&b, "SF:/s/y.rs\nDA:5,1\nend_of_record\nTN:t\nSF:/s/x.rs\nFNDA:3,f\nDA:2,1\nend_of_record\n").unwrap();
    let stdin = "TN:t\nSF:/s/x.rs\nDA:1,10\nBRDA:1,0,0,-\nend_of_record\n";
    let (a_arg, b_arg) = (a.to_str().unwrap(), b.to_str().unwrap());
    let want = "\
SF:/s/y.rs\nFNF:0\nFNH:0\nDA:5,1\nBRF:0\nBRH:0\nLF:1\nLH:1\nend_of_record
TN:t\nSF:/s/x.rs\nFN:1,f\nFNDA:5,f\nFNF:1\nFNH:1\nDA:1,12\nDA:2,1\nBRDA:1,0,0,-\nBRF:1\nBRH:0\nLF:2\nLH:2\nend_of_record
";
    // To standard output.
    let out = livecov(&["merge", a_arg, "-", b_arg], stdin.as_bytes());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8(out.stdout).unwrap(), want);

    // To a file, replacing what was there, with nothing left beside it.
    let merged = dir.join("merged.lcov");
    std::fs::write(&merged, "old").unwrap();
    let out = livecov(&["merge", a_arg, b_arg, "-", "-o", merged.to_str().unwrap()], stdin.as_bytes());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stdout.is_empty());
    assert_eq!(std::fs::read_to_string(&merged).unwrap(), want);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("2 record(s), lines 3/3"), "{stderr}");
    let mut names: Vec<String> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["a.lcov", "b.lcov", "merged.lcov"]);

    // A merged report merges again to itself.
    assert_eq!(String::from_utf8(ok(&["merge", merged.to_str().unwrap()]).stdout).unwrap(), want);
}

/// On a full disk (a tmpfs filled up), and into a full device: a clear
/// error, and the last output whole, with nothing beside it.
#[test]
fn merge_on_a_full_disk_says_so_and_keeps_the_last_output() {
    let dir = scratch("cli", "full-disk");
    let input = dir.join("in.lcov");
    let records: String = (0..50).map(|i| format!("SF:/s/f{i}.c\nDA:1,{i}\nDA:2,1\nend_of_record\n")).collect();
    std::fs::write(&input, records).unwrap();
    let disk = SmallDisk::mount(&dir.join("full"), "64k");
    let out = dir.join("full/out.lcov");
    std::fs::write(&out, "the last report\n").unwrap();
    disk.fill();
    let stderr = fails(&["merge", input.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert!(stderr.contains("No space left on device"), "{stderr}");
    assert!(stderr.contains(&dir.join("full").display().to_string()), "names where: {stderr}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "the last report\n");
    let mut names: Vec<String> = std::fs::read_dir(dir.join("full")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["filler", "out.lcov"]);
    drop(disk);

    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").expect("/dev/full");
    let to_full = Command::new(livecov_bin()).args(["merge", input.to_str().unwrap()]).stdout(full).output().expect("run livecov");
    let stderr = String::from_utf8_lossy(&to_full.stderr);
    assert!(!to_full.status.success(), "{stderr}");
    assert!(stderr.contains("standard output: No space left on device"), "{stderr}");
}

/// `-o` naming a pipe (or a device such as `/dev/null`) writes into it: a
/// file renamed over it would replace it, and as root that replaced
/// `/dev/null` itself.
#[test]
fn an_output_that_is_a_pipe_is_written_into_not_replaced() {
    use std::os::unix::fs::FileTypeExt;
    let dir = scratch("cli", "pipe");
    let input = dir.join("in.lcov");
    std::fs::write(&input, "SF:/s/x.rs\nDA:1,2\nend_of_record\n").unwrap();
    let fifo = dir.join("out.fifo");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    for command in [&["merge"][..], &["report", "--format", "json"][..]] {
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = fifo.clone();
        // Opening the pipe waits for a writer: one that renamed a file over
        // it never comes.
        std::thread::spawn(move || tx.send(std::fs::read_to_string(reader).unwrap()));
        let mut args = command.to_vec();
        args.extend([input.to_str().unwrap(), "-o", fifo.to_str().unwrap()]);
        ok(&args);
        let read = rx.recv_timeout(Duration::from_secs(30)).unwrap_or_else(|_| panic!("{command:?} wrote nothing into the pipe"));
        assert!(read.contains("x.rs"), "{command:?} wrote {read:?}");
        assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo(), "{command:?} replaced the pipe");
    }
    let mut names: Vec<String> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["in.lcov", "out.fifo"]);
}

#[test]
fn merge_errors_name_the_file_and_line_and_write_nothing() {
    let dir = scratch("cli", "merge-errors");
    let good = dir.join("good.lcov");
    let bad = dir.join("bad.lcov");
    std::fs::write(&good, "SF:a\nDA:1,1\nend_of_record\n").unwrap();
    std::fs::write(&bad, "SF:a\nDA:1,1\nDA:2,many\nend_of_record\n").unwrap();
    let out = dir.join("out.lcov");
    let stderr = fails(&["merge", good.to_str().unwrap(), bad.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert!(stderr.contains(&format!("{}:3: DA: bad number \"many\"", bad.display())), "{stderr}");
    assert!(!out.exists(), "a failed merge wrote its output");

    // Empty input is an empty report.
    assert!(ok(&["merge", "-"]).stdout.is_empty());
}

#[test]
fn merge_of_a_missing_file_or_no_file_says_so() {
    let stderr = fails(&["merge", "/nonexistent/x.lcov"]);
    assert!(stderr.contains("cannot open /nonexistent/x.lcov"), "{stderr}");
    let stderr = fails(&["merge"]);
    assert!(stderr.contains("<FILE>"), "{stderr}");
}

// ---------------------------------------------------------------- dump and reset

#[test]
fn dump_writes_what_the_agent_serves_and_names_the_instance() {
    let s = start("dump", &[]);
    assert!(s.get("/fib?n=10").ends_with("55"));
    let direct = s.coverage("");
    for target in [socket_arg(&s), format!("unix:{}", socket_arg(&s))] {
        let out = ok(&["dump", &target]);
        assert_eq!(String::from_utf8(out.stdout).unwrap(), direct, "livecov dump {target}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(&format!("instance {}", s.instance())), "{stderr}");
    }
    assert_eq!(function_count(&direct, "handlers.rs", FIB), 1);

    // Named, to a file.
    let file = s.dir.join("named.lcov");
    ok(&["dump", &socket_arg(&s), "--test", "checkout flow", "-o", file.to_str().unwrap()]);
    let named = std::fs::read_to_string(&file).unwrap();
    assert!(named.starts_with("TN:checkout flow\nSF:"), "{}", &named[..named.len().min(80)]);
    assert_eq!(named.replace("TN:checkout flow\n", ""), direct);

    // JSON and a raw profile.
    let json = ok(&["dump", &socket_arg(&s), "--format", "json"]).stdout;
    let json = String::from_utf8(json).unwrap();
    assert!(json.trim_start().starts_with('{') && json.contains("handlers.rs"), "{json}");
    let profraw = s.dir.join("snapshot.profraw");
    ok(&["dump", &socket_arg(&s), "--format", "profraw", "-o", profraw.to_str().unwrap()]);
    let bytes = std::fs::read(&profraw).unwrap();
    assert_eq!(bytes[..8], 0xff6c_7072_6f66_7281u64.to_le_bytes(), "not a raw profile");
}

#[test]
fn dump_reset_and_reset_give_per_test_reports_that_merge() {
    let s = start("reset", &[]);
    let dir = &s.dir;
    let (first, second, all) = (dir.join("first.lcov"), dir.join("second.lcov"), dir.join("all.lcov"));
    for n in [5, 6, 7] {
        s.get(&format!("/fib?n={n}"));
    }
    ok(&["dump", &socket_arg(&s), "--test", "first", "--reset", "-o", first.to_str().unwrap()]);
    s.get("/fib?n=8");
    s.get("/hello?name=x");
    ok(&["dump", &socket_arg(&s), "-o", second.to_str().unwrap()]);
    let (first_text, second_text) = (std::fs::read_to_string(&first).unwrap(), std::fs::read_to_string(&second).unwrap());
    assert_eq!(function_count(&first_text, "handlers.rs", FIB), 3);
    assert_eq!(function_count(&second_text, "handlers.rs", FIB), 1, "the counters were not reset");

    // Merged without test names: every call, counted once.
    let unnamed = s.dir.join("first-unnamed.lcov");
    std::fs::write(&unnamed, first_text.replace("TN:first\n", "")).unwrap();
    ok(&["merge", unnamed.to_str().unwrap(), second.to_str().unwrap(), "-o", all.to_str().unwrap()]);
    let all_text = std::fs::read_to_string(&all).unwrap();
    assert_eq!(function_count(&all_text, "handlers.rs", FIB), 4);
    assert_eq!(function_count(&all_text, "handlers.rs", "handlers5hello"), 1);
    let (hit_all, hit_first, hit_second) = (lines_hit(&all_text), lines_hit(&first_text), lines_hit(&second_text));
    for (file, lines) in &hit_all {
        let mut union: Vec<u32> = hit_first[file].iter().chain(&hit_second[file]).copied().collect();
        union.sort_unstable();
        union.dedup();
        assert_eq!(lines, &union, "{file}");
    }
    // With test names: apart.
    let per_test = String::from_utf8(ok(&["merge", first.to_str().unwrap(), second.to_str().unwrap()]).stdout).unwrap();
    assert!(per_test.starts_with("SF:") && per_test.contains("\nTN:first\nSF:"), "unnamed records first, then TN:first");

    // livecov reset: nothing since.
    let out = ok(&["reset", &format!("unix:{}", socket_arg(&s))]);
    assert!(String::from_utf8_lossy(&out.stderr).contains(&format!("reset instance {}", s.instance())));
    assert_eq!(function_count(&s.coverage(""), "handlers.rs", "handlers5hello"), 0);
}

/// `dump --reset` to a full disk fails before it resets: the counts a
/// reset takes are only in its result.
#[test]
fn dump_reset_onto_a_full_disk_fails_and_resets_nothing() {
    let s = start("reset-full", &[]);
    s.get("/fib?n=5");
    let disk = SmallDisk::mount(&s.dir.join("full"), "64k");
    let out = s.dir.join("full/out.lcov");
    std::fs::write(&out, "the last report\n").unwrap();
    disk.fill();
    let stderr = fails(&["dump", &socket_arg(&s), "--reset", "-o", out.to_str().unwrap()]);
    assert!(stderr.contains("No space left on device"), "{stderr}");
    assert!(stderr.contains(&s.dir.join("full").display().to_string()), "names where: {stderr}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "the last report\n");
    let mut names: Vec<String> = std::fs::read_dir(s.dir.join("full")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["filler", "out.lcov"]);
    drop(disk);
    assert_eq!(function_count(&s.coverage(""), "handlers.rs", FIB), 1, "the counters were reset");
}

#[test]
fn tcp_targets_need_the_token() {
    let s = start("tcp", &[("LIVECOV_LISTEN", "127.0.0.1:0"), ("LIVECOV_TOKEN", "s3cret")]);
    let meta = wait_for(|| {
        let m = std::fs::read_to_string(s.cov_dir().join("reports").join(format!("{}.json", s.instance()))).ok()?;
        m.contains("\"tcp\":\"").then_some(m)
    });
    let tcp = meta.split("\"tcp\":\"").nth(1).and_then(|r| r.split('"').next()).expect("tcp address in the metadata");
    let url = format!("http://{tcp}");
    s.get("/fib?n=3");

    let stderr = fails(&["dump", &url]);
    assert!(stderr.contains("401") && stderr.contains("--token"), "{stderr}");
    let stderr = fails(&["dump", &url, "--token", "wrong"]);
    assert!(stderr.contains("401") && stderr.contains("token was refused"), "{stderr}");

    let out = ok(&["dump", &url, "--token", "s3cret"]);
    assert_eq!(function_count(&String::from_utf8(out.stdout).unwrap(), "handlers.rs", FIB), 1);
    let token_file = s.dir.join("token");
    std::fs::write(&token_file, "s3cret\n").unwrap();
    let out = ok(&["dump", &url, "--token-file", token_file.to_str().unwrap(), "--format", "json"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("handlers.rs"));
    // The token from the environment, as the agent takes it.
    let out = Command::new(livecov_bin()).args(["reset", &url]).env("LIVECOV_TOKEN", "s3cret").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(function_count(&s.coverage(""), "handlers.rs", FIB), 0);
}

#[test]
fn dead_and_wrong_targets_fail_clearly() {
    let dir = scratch("cli", "dead");
    // A socket file whose process is gone: nobody listens.
    let dead = dir.join("rust-1-dead.sock");
    drop(std::os::unix::net::UnixListener::bind(&dead).expect("bind"));
    assert!(dead.exists());
    for cmd in ["dump", "reset"] {
        let stderr = fails(&[cmd, dead.to_str().unwrap()]);
        assert!(stderr.contains("refused the connection") && stderr.contains("still running"), "{stderr}");
    }
    // No socket there at all.
    let stderr = fails(&["dump", &format!("unix:{}", dir.join("none.sock").display())]);
    assert!(stderr.contains("no socket at") && stderr.contains("LIVECOV_DIR"), "{stderr}");
    // A TCP port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let stderr = fails(&["dump", &format!("http://127.0.0.1:{port}")]);
    assert!(stderr.contains("refused the connection") && stderr.contains("LIVECOV_LISTEN"), "{stderr}");
    // A listener that never answers: the timeout.
    let silent = dir.join("silent.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&silent).expect("bind");
    let start = Instant::now();
    let stderr = fails(&["dump", silent.to_str().unwrap(), "--timeout", "0.3"]);
    assert!(stderr.contains("within 0.3s") && stderr.contains("--timeout"), "{stderr}");
    assert!(start.elapsed() < Duration::from_secs(10));
    // Not a target, and a reset that must not happen when the output cannot be written.
    let stderr = fails(&["dump", "localhost:9464"]);
    assert!(stderr.contains("http://HOST:PORT"), "{stderr}");
    let stderr = fails(&["dump", dead.to_str().unwrap(), "--reset", "-o", "/nonexistent/dir/out.lcov"]);
    assert!(stderr.contains("cannot create"), "{stderr}");
}

#[test]
fn a_reset_is_not_done_when_the_output_cannot_be_written() {
    let s = start("no-output", &[]);
    s.get("/fib?n=4");
    let stderr = fails(&["dump", &socket_arg(&s), "--reset", "-o", "/nonexistent/dir/out.lcov"]);
    assert!(stderr.contains("cannot create"), "{stderr}");
    assert_eq!(function_count(&s.coverage(""), "handlers.rs", FIB), 1, "the counters were reset");
}

/// `livecov merge ... | head`: once the reader has what it wanted, the
/// command ends quietly, as a filter does; a dump that resets is not done
/// when its output is already closed (its counts would be lost).
#[test]
fn a_reader_that_stops_reading_ends_the_command_quietly() {
    let s = start("stdout-closed", &[]);
    s.get("/fib?n=4");
    let lcov = s.dir.join("dumped.lcov");
    ok(&["dump", &socket_arg(&s), "-o", lcov.to_str().unwrap()]);
    let [(_, closed), _] = livecov_tests::output_taking_nothing();
    let run = |args: &[&str], stdout: Stdio| {
        let out = Command::new(livecov_bin()).args(args).stdout(stdout).stderr(Stdio::piped()).output().expect("run livecov");
        (out.status, String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let lcov = lcov.to_str().unwrap();
    let (status, stderr) = run(&["merge", lcov, lcov], closed);
    assert!(status.success() && stderr.is_empty(), "{status}: {stderr}");
    let [(_, closed), (_, full)] = livecov_tests::output_taking_nothing();
    let (status, stderr) = run(&["dump", &socket_arg(&s), "--reset"], closed);
    assert!(!status.success() && stderr.contains("standard output closed by its reader: nothing reset"), "{status}: {stderr}");
    assert_eq!(function_count(&s.coverage(""), "handlers.rs", FIB), 1, "the counters were reset");
    // Another failure to write is an error as before.
    let (status, stderr) = run(&["merge", lcov, lcov], full);
    assert!(!status.success() && stderr.contains("writing to standard output: No space left on device"), "{status}: {stderr}");
}

/// A message a command cannot write (its standard error a full disk, or a
/// pipe nobody reads) is lost, and the command does its work. With
/// `eprintln!`, `dump` and `merge` panicked (status 101) on their last line.
#[test]
fn a_message_that_cannot_be_written_does_not_stop_the_command() {
    let s = start("stderr-closed", &[]);
    s.get("/fib?n=4");
    for k in 0..2 {
        let run = |args: &[&str]| {
            let (what, stderr) = livecov_tests::output_taking_nothing().into_iter().nth(k).unwrap();
            let status = Command::new(livecov_bin()).args(args).stderr(stderr).status().expect("run livecov");
            assert!(status.success(), "livecov {args:?}, stderr {what}: {status}");
        };
        let dumped = s.dir.join(format!("dumped-{k}.lcov"));
        let merged = s.dir.join(format!("merged-{k}.lcov"));
        let (dumped, merged) = (dumped.to_str().unwrap(), merged.to_str().unwrap());
        run(&["dump", &socket_arg(&s), "-o", dumped]);
        assert_eq!(function_count(&std::fs::read_to_string(dumped).unwrap(), "handlers.rs", FIB), 1);
        run(&["merge", dumped, dumped, "-o", merged]);
        assert_eq!(function_count(&std::fs::read_to_string(merged).unwrap(), "handlers.rs", FIB), 2);
    }
}

#[test]
fn every_subcommand_has_help_with_an_example() {
    for cmd in ["merge", "dump", "reset"] {
        let help = String::from_utf8(ok(&[cmd, "--help"]).stdout).unwrap();
        assert!(help.contains("Example") && help.contains(&format!("livecov {cmd} ")), "{cmd}: {help}");
    }
    let help = String::from_utf8(ok(&["--help"]).stdout).unwrap();
    for cmd in ["convert", "merge", "dump", "reset"] {
        assert!(help.contains(cmd), "{help}");
    }
}
