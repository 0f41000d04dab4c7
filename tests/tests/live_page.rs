//! The sidecar's live page (`GET /`, `GET /file`), loaded in headless
//! Chromium (Debian's `chromium`) against a sidecar over running processes
//! of the fixture service: its totals are those of `GET
//! /coverage?format=json`, they grow with traffic, and a screenshot of the
//! page and of a file's lines is left in `target/live-page/` for people to
//! look at. Then what a hostile report can put on the page (file names,
//! errors) is escaped, and no file outside `--source-root` is served.

mod replicas;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use replicas::*;

/// Headless Chromium on `url` with `args` (`--dump-dom`, `--screenshot=...`),
/// a fresh profile in `dir`; its standard output.
fn chromium(dir: &Path, args: &[&str], url: &str) -> String {
    let profile = tempfile_dir(dir, "chromium-profile");
    let mut child = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("run chromium (install it: tests/scripts/install-deps.sh)");
    let mut stdout = child.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        let _ = std::io::Read::read_to_string(&mut stdout, &mut out);
        out
    });
    let deadline = Instant::now() + Duration::from_secs(90);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for chromium") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium {args:?} {url} did not finish within 90 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "chromium {args:?} {url} failed: {status}");
    reader.join().expect("chromium's output")
}

/// A new empty folder under `dir`.
fn tempfile_dir(dir: &Path, name: &str) -> PathBuf {
    for i in 0.. {
        let path = dir.join(format!("{name}-{i}"));
        if std::fs::create_dir(&path).is_ok() {
            return path;
        }
    }
    unreachable!()
}

fn dump_dom(dir: &Path, url: &str) -> String {
    let dom = chromium(dir, &["--dump-dom"], url);
    assert!(dom.contains("</html>"), "not a page from {url}:\n{dom}");
    dom
}

/// The `data-hit` and `data-found` of the element with `id`.
fn hit_found(html: &str, id: &str) -> (u64, u64) {
    let start = html.find(&format!("id=\"{id}\"")).unwrap_or_else(|| panic!("no #{id} in\n{html}"));
    let tag = &html[start..start + html[start..].find('>').expect("end of tag")];
    let attr = |name: &str| -> u64 {
        let at = tag.find(&format!("{name}=\"")).unwrap_or_else(|| panic!("no {name} in {tag}")) + name.len() + 2;
        tag[at..at + tag[at..].find('"').expect("end of value")].parse().expect("a number")
    };
    (attr("data-hit"), attr("data-found"))
}

/// The totals the page shows, as `GET /coverage?format=json` names them.
fn page_totals(html: &str) -> serde_json::Value {
    let (lines_hit, lines) = hit_found(html, "total-lines");
    let (functions_hit, functions) = hit_found(html, "total-functions");
    let (branches_hit, branches) = hit_found(html, "total-branches");
    serde_json::json!({
        "lines": lines, "lines_hit": lines_hit, "functions": functions,
        "functions_hit": functions_hit, "branches": branches, "branches_hit": branches_hit,
    })
}

/// The number of points of the chart.
fn chart_points(html: &str) -> usize {
    let at = html.find("data-points=\"").expect("the chart") + "data-points=\"".len();
    html[at..at + html[at..].find('"').expect("end")].parse().expect("a number")
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| if b.is_ascii_alphanumeric() || b"-._~".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect()
}

/// The lines of `file` in an LCOV text: (line, hits).
fn da_lines(lcov: &str, file: &str) -> Vec<(u32, u64)> {
    let record = lcov.split("end_of_record").find(|r| r.lines().any(|l| l.strip_prefix("SF:") == Some(file)));
    record
        .expect("the file's record")
        .lines()
        .filter_map(|l| l.strip_prefix("DA:"))
        .map(|da| {
            let mut f = da.split(',');
            (f.next().unwrap().parse().unwrap(), f.next().unwrap().parse().unwrap())
        })
        .collect()
}

#[test]
fn the_live_page_in_chromium_shows_the_merge_grow_with_traffic() {
    let dir = scratch("live-page", "grow");
    let cov = dir.join("cov");
    let p1 = Replica::start("127.0.0.1", None, None, &cov, &[]);
    let p2 = Replica::start("127.0.0.1", None, None, &cov, &[]);
    p1.get("/hello?name=page");
    let sources = livecov_tests::workspace_root().join("fixtures/service");
    let cov_arg = cov.to_str().unwrap();
    let root_arg = sources.to_str().unwrap();
    // Without --token: a browser cannot send one (checked below with one).
    let sidecar = Sidecar::start(&["--dir", cov_arg, "--listen", "127.0.0.1:0", "--source-root", root_arg], None);
    let base = format!("http://{}", sidecar.addr.expect("TCP"));

    let before = dump_dom(&dir, &format!("{base}/?refresh=0"));
    let json = sidecar.get("/coverage?format=json").json();
    assert_eq!(page_totals(&before), json["totals"], "the page's totals are not GET /coverage?format=json's");
    assert!(json["totals"]["lines_hit"].as_u64().unwrap() > 0, "{json}");
    // A row per file with its counts, linked to its lines.
    for f in json["files"].as_array().expect("files") {
        let name = f["file"].as_str().unwrap();
        let link = format!("<a href=\"file?path={name}&amp;refresh=0\">{name}</a>");
        assert!(before.contains(&link), "no {link} in\n{before}");
        let counts = format!(">{}/{}</td>", f["lines_hit"], f["lines"]);
        assert!(before.contains(&counts), "no {counts} in\n{before}");
    }
    // Every target with its state.
    for t in sidecar.targets() {
        let address = t["address"].as_str().unwrap();
        assert!(before.contains(address), "no target {address} in\n{before}");
        assert_eq!(t["state"], "running", "{t}");
    }
    assert!(before.contains("<td class=\"state-running\">running</td>"), "{before}");

    // Traffic: the page, loaded again, shows more, and the chart a step.
    p2.get("/fib?n=10");
    p1.get("/primes?limit=30");
    let after = dump_dom(&dir, &format!("{base}/?refresh=0"));
    let json = sidecar.get("/coverage?format=json").json();
    assert_eq!(page_totals(&after), json["totals"]);
    let grew = |key: &str| page_totals(&after)[key].as_u64() > page_totals(&before)[key].as_u64();
    assert!(grew("lines_hit") && grew("functions_hit"), "no growth:\n{before}\n{after}");
    assert!(chart_points(&after) >= 2, "{after}");

    // The page reloads itself, every 5 s unless ?refresh=N says (0: never).
    let meta = |query: &str| {
        let r = sidecar.get(&format!("/{query}"));
        assert_eq!((r.status, r.header("content-type")), (200, Some("text/html; charset=utf-8")));
        // No script runs on it, should a name ever escape escaping.
        assert!(r.header("content-security-policy").is_some_and(|p| p.starts_with("default-src 'none';")));
        let page = r.text();
        let at = page.find("http-equiv=\"refresh\" content=\"")?;
        Some(page[at..].split('"').nth(3)?.to_owned())
    };
    assert_eq!(meta("").as_deref(), Some("5"));
    assert_eq!(meta("?refresh=2").as_deref(), Some("2"));
    assert_eq!(meta("?refresh=0"), None);
    assert_eq!(sidecar.get("/?refresh=soon").status, 400);
    assert_eq!(sidecar.get("/?color=red").status, 400);
    assert_eq!(sidecar.post("/").status, 405);
    let metrics = sidecar.get("/metrics").text();
    assert!(metrics.contains("livecov_sidecar_requests_total{route=\"/\"} "), "{metrics}");

    // One more step for the chart people look at below.
    p2.get("/hello");
    assert_eq!(sidecar.get("/").status, 200);

    // Screenshots for people to look at.
    let shots = livecov_tests::workspace_root().join("target/live-page");
    std::fs::create_dir_all(&shots).expect("target/live-page");
    let page_png = shots.join("sidecar.png");
    let _ = std::fs::remove_file(&page_png);
    chromium(&dir, &[&format!("--screenshot={}", page_png.display()), "--window-size=1200,900"], &format!("{base}/"));

    // A file's lines, coloured by their hits in the merge.
    let handlers = json["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["file"].as_str())
        .find(|f| f.ends_with("handlers.rs"))
        .expect("handlers.rs in the merge")
        .to_owned();
    let lines = da_lines(&sidecar.coverage(""), &handlers);
    let covered = lines.iter().find(|(_, hits)| *hits > 0).expect("a covered line").0;
    let uncovered = lines.iter().find(|(_, hits)| *hits == 0).expect("an uncovered line").0;
    let url = format!("{base}/file?path={}&refresh=0", percent_encode(&handlers));
    let file = dump_dom(&dir, &url);
    assert!(file.contains(&format!("<tr id=\"L{covered}\" class=\"covered\">")), "line {covered} not covered:\n{file}");
    assert!(file.contains(&format!("<tr id=\"L{uncovered}\" class=\"uncovered\">")), "line {uncovered}:\n{file}");
    assert!(file.contains("pub fn fib("), "the file's text is not shown:\n{file}");
    let file_png = shots.join("file.png");
    let _ = std::fs::remove_file(&file_png);
    chromium(&dir, &[&format!("--screenshot={}", file_png.display()), "--window-size=1200,900"], &url);
    for png in [&page_png, &file_png] {
        let bytes = std::fs::read(png).unwrap_or_else(|e| panic!("no screenshot {}: {e}", png.display()));
        assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n") && bytes.len() > 10_000, "{} is not a screenshot", png.display());
    }

    // On TCP with --token, the page is data like the rest: the token is needed.
    let guarded = Sidecar::start(&["--dir", cov_arg, "--listen", "127.0.0.1:0", "--source-root", root_arg], Some("page-secret"));
    let addr = guarded.addr.expect("TCP");
    let file_path = format!("/file?path={}", percent_encode(&handlers));
    for path in ["/", file_path.as_str()] {
        for token in [None, Some("wrong")] {
            assert_eq!(tcp_request(addr, "GET", path, token).status, 401, "GET {path} with {token:?}");
        }
        let r = tcp_request(addr, "GET", path, Some("page-secret"));
        assert_eq!(r.status, 200, "GET {path}: {}", String::from_utf8_lossy(&r.body));
    }
}

#[test]
fn the_live_page_escapes_what_reports_say_and_serves_no_file_outside_the_source_root() {
    let dir = scratch("live-page", "hostile");
    let cov = dir.join("cov");
    let root = dir.join("src");
    std::fs::create_dir_all(cov.join("reports")).unwrap();
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("ok.rs"), "fn ok() {}\nfn never() {}\n").unwrap();
    std::fs::write(dir.join("secret.txt"), "not to be served\n").unwrap();
    std::os::unix::fs::symlink(dir.join("secret.txt"), root.join("link.rs")).unwrap();
    let secret = dir.join("secret.txt").display().to_string();
    let hostile = "<script>alert(\"file\")</script>.rs";
    // The report of an exited process, naming files a browser or the
    // sidecar must not take for what they say.
    let record = |path: &str| format!("SF:{path}\nDA:1,1\nDA:2,0\nLF:2\nLH:1\nend_of_record\n");
    let report: String = ["ok.rs", hostile, "../secret.txt", "link.rs", &secret].iter().map(|p| record(p)).collect();
    std::fs::write(cov.join("reports/rust-1-hostile.lcov"), report).unwrap();
    // A malformed report whose name (so its error) is markup.
    let bad_name = "<img src=x onerror=alert(1)>";
    std::fs::write(cov.join(format!("reports/{bad_name}.lcov")), "SF:x.rs\nDA:one,1\nend_of_record\n").unwrap();

    let cov_arg = cov.to_str().unwrap();
    let root_arg = root.to_str().unwrap();
    let sidecar = Sidecar::start(&["--dir", cov_arg, "--listen", "127.0.0.1:0", "--source-root", root_arg], None);
    let r = sidecar.get("/?refresh=0");
    assert_eq!(r.status, 200);
    let page = r.text();
    for raw in ["<script>", "<img src=x"] {
        assert!(!page.contains(raw), "{raw} is not escaped:\n{page}");
    }
    assert!(page.contains(">&lt;script&gt;alert(&quot;file&quot;)&lt;/script&gt;.rs</a>"), "{page}");
    assert!(page.contains("&lt;img src=x onerror=alert(1)&gt;.lcov"), "the report's error is not shown:\n{page}");
    assert!(page.contains("<td class=\"state-error\">error</td>"), "{page}");

    // A file of the report under the root is shown; nothing else.
    let file = |path: &str| sidecar.get(&format!("/file?path={}", percent_encode(path)));
    let ok = file("ok.rs");
    assert_eq!(ok.status, 200, "{}", String::from_utf8_lossy(&ok.body));
    let ok = ok.text();
    assert!(ok.contains("<tr id=\"L1\" class=\"covered\">") && ok.contains("<tr id=\"L2\" class=\"uncovered\">"), "{ok}");
    for path in ["../secret.txt", "link.rs", &secret, hostile, "/etc/passwd", "../../../../../../etc/passwd", "src/../ok.rs"] {
        let r = file(path);
        assert_eq!(r.status, 404, "GET /file?path={path}: {}", String::from_utf8_lossy(&r.body));
        assert!(!r.text().contains("not to be served"), "{path} served the secret");
        assert!(r.json()["error"].is_string());
    }
    assert_eq!(sidecar.get("/file").status, 400);
    assert_eq!(sidecar.get("/file?path=ok.rs&path=x").status, 400);

    // Without --source-root there is no file view, and the page has no links.
    let plain = Sidecar::start(&["--dir", cov_arg, "--listen", "127.0.0.1:0"], None);
    let r = plain.get("/file?path=ok.rs");
    assert_eq!(r.status, 404);
    assert!(r.json()["error"].as_str().unwrap().contains("--source-root"));
    assert!(!plain.get("/").text().contains("href=\"file?"));

    // A --source-root that is not a folder stops the sidecar at its start.
    let socket = dir.join("s.sock");
    let out = livecov(&["sidecar", "--socket", socket.to_str().unwrap(), "--source-root", &secret]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--source-root"), "{out:?}");
}

#[test]
fn with_a_poll_interval_the_chart_follows_the_polls_while_nobody_looks() {
    let dir = scratch("live-page", "polls");
    let cov = dir.join("cov");
    let p = Replica::start("127.0.0.1", None, None, &cov, &[]);
    p.instance();
    let cov_arg = cov.to_str().unwrap();
    let sidecar = Sidecar::start(&["--dir", cov_arg, "--listen", "127.0.0.1:0", "--poll-interval", "0.2"], None);
    // Rounds, read from /metrics, which merges nothing: a poll merges
    // before the next poll starts.
    let rounds = || {
        let metrics = sidecar.get("/metrics").text();
        let line = metrics.lines().find_map(|l| l.strip_prefix("livecov_sidecar_rounds_total ")).map(str::to_owned);
        line.and_then(|n| n.trim().parse::<u64>().ok()).unwrap_or(0)
    };
    wait_for("a first poll and its merge", || (rounds() >= 2).then_some(()));
    p.get("/fib?n=5");
    // The round after the next one started after the traffic; its merge
    // is done when the one after it is counted.
    let seen = rounds();
    wait_for("a poll after the traffic, and its merge", || (rounds() >= seen + 3).then_some(()));
    // The first request for coverage: the points before it are the polls'.
    let page = sidecar.get("/?refresh=0").text();
    assert!(chart_points(&page) >= 2, "the polls drew no step:\n{page}");
}
