//! redis, a real C server with timers of its own, under
//! `LD_PRELOAD=liblivecov.so` and traffic: redis from Debian's source
//! package built with clang-19 and coverage (tests/scripts/deps-redis.sh,
//! which `make test` runs), redis-benchmark of the same build sending
//! requests the whole time. Dumps under traffic are warm: each computes
//! again only what the functions that ran since the last one reach, in
//! records kept from dump to dump (docs/agent.md). Between rounds of such
//! dumps, the server is held still (`DEBUG SLEEP`, its one thread that runs
//! requests and timers asleep) and dumped between two raw profiles of it
//! (`?format=profraw`) that are the same bytes: the dump is llvm-cov 22's
//! report over that profile, byte for byte, every round.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use livecov_tests::http::unix_request;
use livecov_tests::lcov::{file_ending, parse_lcov};
use livecov_tests::native::{clean_command, debian_build, liblivecov};
use livecov_tests::service::find_instance;
use livecov_tests::{free_port, llvm_tool, run_checked, workspace_root, Killed};

/// Rounds of dumps under traffic, each ended by a dump of the held server.
const ROUNDS: usize = 3;
/// Dumps under traffic a round, `GAP` apart.
const DUMPS: usize = 10;
const GAP: Duration = Duration::from_millis(100);
/// How long `DEBUG SLEEP` holds the server, and the tries at a dump while
/// it does (one may begin before the sleep, or end after it).
const HOLD_SECS: u32 = 2;
const HOLD_TRIES: usize = 3;
/// Longest wait for redis to answer, or for its agent's socket.
const WITHIN: Duration = Duration::from_secs(20);
/// redis's function that runs a command, once a request.
const COMMAND: &str = "processCommand";

/// The folder of redis's programs as deps-redis.sh built them
/// (target/redis/current).
fn redis_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| debian_build("redis", "src/src/redis-server").parent().expect("a folder").to_path_buf())
}

/// One of redis's programs; its own profile is not what is tested.
fn redis_command(program: &str) -> Command {
    let mut command = clean_command(&redis_bin().join(program));
    command.env("LLVM_PROFILE_FILE", "/dev/null").stdin(Stdio::null()).stdout(Stdio::null());
    command
}

/// `redis-cli -p PORT ARGS...`, waited for: whether it answered.
fn cli(port: u16, args: &[&str]) -> bool {
    redis_command("redis-cli").arg("-p").arg(port.to_string()).args(args).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
}

/// llvm-profdata and llvm-cov 22 over `profraw`: the report they make.
fn llvm_cov_lcov(profraw: &Path, dir: &Path) -> String {
    let profdata = dir.join("held.profdata");
    run_checked(
        Command::new(llvm_tool("llvm-profdata")).args(["merge", "-sparse"]).arg(profraw).arg("-o").arg(&profdata),
        "llvm-profdata merge",
    );
    let out = run_checked(
        Command::new(llvm_tool("llvm-cov"))
            .args(["export", "-format=lcov"])
            .arg(redis_bin().join("redis-server"))
            .arg("-instr-profile")
            .arg(&profdata),
        "llvm-cov export",
    );
    String::from_utf8(out.stdout).expect("llvm-cov's LCOV is UTF-8")
}

#[test]
fn warm_dumps_of_redis_under_traffic_are_llvm_covs_report_of_the_same_moment() {
    let dir = workspace_root().join("target/tmp/redis").join(format!("traffic-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create a scratch folder");
    let cov = dir.join("cov");
    let port = free_port();
    let mut server = redis_command("redis-server");
    server
        .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--daemonize", "no"])
        .args(["--enable-debug-command", "local", "--logfile", ""])
        .arg("--dir")
        .arg(&dir)
        .arg("--port")
        .arg(port.to_string())
        .env("LD_PRELOAD", liblivecov())
        .env("LIVECOV_DIR", &cov)
        .stderr(std::fs::File::create(dir.join("stderr")).expect("stderr file"));
    let server = Killed(server.spawn().expect("start redis-server"));
    let stderr = || std::fs::read_to_string(dir.join("stderr")).unwrap_or_default();
    let pid = server.0.id();
    let deadline = Instant::now() + WITHIN;
    while !cli(port, &["ping"]) {
        assert!(Instant::now() < deadline, "redis did not answer within {WITHIN:?}\n{}", stderr());
        std::thread::sleep(Duration::from_millis(20));
    }
    let instance = livecov_tests::wait_for("the agent's socket", Duration::from_millis(20), || find_instance(&cov, "native", pid));
    let socket = cov.join("sockets").join(format!("{instance}.sock"));
    let get = |path: &str| {
        let r = unix_request(&socket, "GET", path, &[]);
        assert_eq!(r.status, 200, "GET {path}: {}\n{}", String::from_utf8_lossy(&r.body), stderr());
        r.body
    };
    let dump = || String::from_utf8(get("/coverage")).expect("an LCOV report is UTF-8");

    let _traffic = Killed(
        redis_command("redis-benchmark")
            .args(["-q", "-l", "-c", "4", "-t", "set,get,incr,lpush,lpop,hset,lrange_100", "-r", "10000"])
            .arg("-p")
            .arg(port.to_string())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-benchmark"),
    );
    let commands = |lcov: &str| file_ending(&parse_lcov(lcov), "server.c").functions.get(COMMAND).copied().unwrap_or(0);
    // The first dump computes every record; the next ones update them.
    let mut last_commands = commands(&dump());
    for round in 0..ROUNDS {
        for _ in 0..DUMPS {
            std::thread::sleep(GAP);
            let lcov = dump();
            assert!(lcov.starts_with("SF:") && lcov.ends_with("end_of_record\n"), "round {round}: not a whole report");
        }
        let held = (0..HOLD_TRIES).find_map(|_| {
            let sleep = Killed(
                redis_command("redis-cli")
                    .arg("-p")
                    .arg(port.to_string())
                    .args(["DEBUG", "SLEEP", &HOLD_SECS.to_string()])
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("start redis-cli"),
            );
            // The command reaches the server's loop, behind the traffic.
            std::thread::sleep(Duration::from_millis(300));
            let before = get("/coverage?format=profraw");
            let lcov = dump();
            let after = get("/coverage?format=profraw");
            drop(sleep);
            (before == after).then_some((lcov, before))
        });
        let (lcov, profraw) = held.unwrap_or_else(|| panic!("round {round}: redis never held still for a dump"));
        let profraw_path = dir.join(format!("held-{round}.profraw"));
        std::fs::write(&profraw_path, &profraw).expect("write the raw profile");
        let expected = llvm_cov_lcov(&profraw_path, &dir);
        if lcov != expected {
            std::fs::write(dir.join(format!("held-{round}.lcov")), &lcov).expect("write the dump");
            std::fs::write(dir.join(format!("held-{round}.llvm-cov.lcov")), &expected).expect("write llvm-cov's");
            let first = lcov.lines().zip(expected.lines()).enumerate().find(|(_, (a, b))| a != b);
            panic!(
                "round {round}: the dump differs from llvm-cov's report, first at (line, (dump, llvm-cov)) {first:?}; both in {}",
                dir.display()
            );
        }
        // The traffic ran between the rounds: the dumps counted it.
        let now = commands(&lcov);
        assert!(now > last_commands, "round {round}: {COMMAND} counted {now} times, {last_commands} the round before");
        last_commands = now;
        // The server answers again once its sleep ended.
        let deadline = Instant::now() + WITHIN;
        while !cli(port, &["ping"]) {
            assert!(Instant::now() < deadline, "redis did not answer after its sleep\n{}", stderr());
        }
    }
    let said = stderr();
    assert!(!said.contains("livecov"), "the agent said something:\n{said}");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
