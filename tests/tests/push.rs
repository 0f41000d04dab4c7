//! `livecov push`, end to end, against a real OCI registry on loopback
//! (Debian's docker-registry, distribution 2.8): a collect folder pushed
//! over plain HTTP and read back over the registry API, byte for byte,
//! and by skopeo; pushed over TLS (a CA the test makes) with an htpasswd
//! login from a config.json; to a registry that takes Bearer tokens from a
//! token service (the test's, issuing a JWT it signs); and the errors: a wrong password, no login,
//! an untrusted certificate, TLS against plain HTTP both ways, a closed
//! port, a missing folder and a folder without merged.lcov.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use livecov_tests::livecov_bin;
use livecov_tests::registry::{Auth, Registry};
use livecov_tests::service::scratch;

const ARTIFACT_TYPE: &str = "application/vnd.livecov.coverage.v1+json";
const MANIFEST_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";

fn path_arg(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

/// `livecov push ARGS` with `env`, and none of the caller's registry
/// configuration: HOME is the scratch folder `home` (no ~/.docker).
fn push(home: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    push_command(home, args, env).output().expect("run livecov push")
}

fn push_command(home: &Path, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(livecov_bin());
    command
        .arg("push")
        .args(args)
        .env("HOME", home)
        .env_remove("DOCKER_CONFIG")
        .env_remove("REGISTRY_AUTH_FILE")
        .env_remove("SSL_CERT_FILE")
        .env_remove("SSL_CERT_DIR")
        .envs(env.iter().copied());
    command
}

fn push_ok(home: &Path, args: &[&str], env: &[(&str, &str)]) -> (String, String) {
    let out = push(home, args, env);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "livecov push {args:?} failed: {stderr}");
    (String::from_utf8(out.stdout).expect("UTF-8"), stderr)
}

/// Runs a push that must exit 1 with nothing on standard output; its standard error.
fn push_fails(home: &Path, args: &[&str], env: &[(&str, &str)]) -> String {
    let out = push(home, args, env);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "livecov push {args:?}: {stderr}");
    assert!(out.stdout.is_empty(), "livecov push {args:?} wrote to stdout: {:?}", out.stdout);
    stderr
}

fn run(program: &str, args: &[&str]) -> Vec<u8> {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {program} (tests/scripts/install-deps.sh installs it): {e}"));
    assert!(out.status.success(), "{program} {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    out.stdout
}

/// A folder as `livecov collect` writes it, with a Cobertura report and a
/// binary file beside: their paths in the folder and their bytes.
fn collect_folder(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let a = "TN:e2e\nSF:/src/app/a.c\nFN:1,main\nFNDA:3,main\nFNF:1\nFNH:1\nDA:1,3\nDA:2,0\nLF:2\nLH:1\nend_of_record\n";
    let b = "TN:e2e\nSF:/src/app/b.c\nDA:7,1\nLF:1\nLH:1\nend_of_record\n";
    std::fs::create_dir_all(dir.join("instances")).unwrap();
    std::fs::write(dir.join("instances/c-11-aa.lcov"), a).unwrap();
    std::fs::write(dir.join("instances/c-12-bb.lcov"), b).unwrap();
    std::fs::write(dir.join("instances/c-11-aa.profraw"), (0..=255u8).cycle().take(3000).collect::<Vec<u8>>()).unwrap();
    std::fs::write(dir.join("manifest.json"), "{\"targets\":[]}\n").unwrap();
    let merged = dir.join("merged.lcov");
    let out = Command::new(livecov_bin())
        .args(["merge", path_arg(&dir.join("instances/c-11-aa.lcov")), path_arg(&dir.join("instances/c-12-bb.lcov"))])
        .args(["-o", path_arg(&merged)])
        .output()
        .expect("run livecov merge");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = Command::new(livecov_bin())
        .args(["report", path_arg(&merged), "--format", "cobertura", "-o", path_arg(&dir.join("coverage.xml"))])
        .env("SOURCE_DATE_EPOCH", "1700000000")
        .output()
        .expect("run livecov report");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut files: Vec<(String, Vec<u8>)> = [
        "coverage.xml",
        "instances/c-11-aa.lcov",
        "instances/c-11-aa.profraw",
        "instances/c-12-bb.lcov",
        "manifest.json",
        "merged.lcov",
    ]
    .iter()
    .map(|name| (name.to_string(), std::fs::read(dir.join(name)).unwrap()))
    .collect();
    files.sort();
    files
}

fn sha256(path: &Path) -> String {
    let out = String::from_utf8(run("sha256sum", &[path_arg(path)])).expect("UTF-8");
    format!("sha256:{}", out.split_whitespace().next().expect("a digest"))
}

/// The manifest's layers as (title, mediaType, digest, size), in its order.
fn layers(manifest: &serde_json::Value) -> Vec<(String, String, String, u64)> {
    manifest["layers"]
        .as_array()
        .expect("layers")
        .iter()
        .map(|l| {
            (
                l["annotations"]["org.opencontainers.image.title"].as_str().expect("a title").to_owned(),
                l["mediaType"].as_str().expect("a mediaType").to_owned(),
                l["digest"].as_str().expect("a digest").to_owned(),
                l["size"].as_u64().expect("a size"),
            )
        })
        .collect()
}

/// An OCI 1.1 artifact of ours with the empty config.
fn check_artifact(manifest: &serde_json::Value) {
    assert_eq!(manifest["schemaVersion"], 2);
    assert_eq!(manifest["mediaType"], MANIFEST_TYPE);
    assert_eq!(manifest["artifactType"], ARTIFACT_TYPE);
    assert_eq!(manifest["config"]["mediaType"], "application/vnd.oci.empty.v1+json");
    assert_eq!(manifest["config"]["digest"], "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a");
    assert_eq!(manifest["config"]["size"], 2);
}

#[test]
fn a_collection_pushed_over_plain_http_comes_back_byte_for_byte() {
    let dir = scratch("push", "plain");
    let registry = Registry::start(&dir, Auth::None, None);
    let folder = dir.join("coverage/e2e");
    let files = collect_folder(&folder);
    let reference = format!("{}/team/coverage:build-1", registry.address);
    let (stdout, stderr) = push_ok(&dir, &["--plain-http", path_arg(&folder), &reference], &[]);
    for (title, bytes) in &files {
        assert!(stderr.contains(&format!("livecov: {title} ({} bytes): ", bytes.len())), "{title} not in\n{stderr}");
    }
    assert!(stderr.contains("livecov: pushed 6 file(s) to"), "{stderr}");

    // The manifest by its tag, as the registry stored it: the digest push printed.
    let answer = registry.get("/v2/team/coverage/manifests/build-1", &[&format!("accept: {MANIFEST_TYPE}")]);
    assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
    let digest = answer.header("docker-content-digest").expect("Docker-Content-Digest").to_owned();
    assert_eq!(stdout, format!("{}/team/coverage@{digest}\n", registry.address));
    let manifest = answer.json();
    check_artifact(&manifest);
    let config = registry.get(&format!("/v2/team/coverage/blobs/{}", manifest["config"]["digest"].as_str().unwrap()), &[]);
    assert_eq!((config.status, config.body.as_slice()), (200, &b"{}"[..]));

    // One layer per file, titled with its path, each blob the file's bytes.
    let layers = layers(&manifest);
    let titles: Vec<&str> = layers.iter().map(|l| l.0.as_str()).collect();
    assert_eq!(titles, files.iter().map(|f| f.0.as_str()).collect::<Vec<_>>());
    for ((title, media_type, digest, size), (_, bytes)) in layers.iter().zip(&files) {
        let want = match title.rsplit_once('.').map(|(_, ext)| ext) {
            Some("lcov") => "text/x-lcov",
            Some("json") => "application/json",
            Some("xml") => "application/xml",
            _ => "application/octet-stream",
        };
        assert_eq!(media_type, want, "{title}");
        assert_eq!(*size, bytes.len() as u64, "{title}");
        assert_eq!(*digest, sha256(&folder.join(title)), "{title}");
        let blob = registry.get(&format!("/v2/team/coverage/blobs/{digest}"), &[]);
        assert_eq!(blob.status, 200, "{title}");
        assert!(blob.body == *bytes, "{title}: the registry's blob is not the file");
    }

    // A second client reads the same manifest.
    let raw = run("skopeo", &["inspect", "--raw", "--tls-verify=false", &format!("docker://{reference}")]);
    assert!(raw == answer.body, "skopeo read another manifest: {}", String::from_utf8_lossy(&raw));

    // Again: every blob is there already, and the tag names the same manifest.
    let (again, stderr) = push_ok(&dir, &["--plain-http", path_arg(&folder), &reference], &[]);
    assert_eq!(again, stdout);
    assert_eq!(stderr.matches(": already there").count(), files.len(), "{stderr}");
    assert!(!stderr.contains(": uploaded"), "{stderr}");

    // The push is done whether or not its reference can be printed: a
    // reader gone ends it quietly, as a filter; a full disk is an error that
    // says so. With `println!`, both panicked (status 101).
    for (k, (what, stdout)) in livecov_tests::output_taking_nothing().into_iter().enumerate() {
        let tag = format!("unprinted-{k}");
        let args = ["--plain-http", path_arg(&folder), &format!("{}/team/coverage:{tag}", registry.address)];
        let out = push_command(&dir, &args, &[]).stdout(stdout).output().expect("run livecov push");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let want = if k == 0 { Some(0) } else { Some(1) };
        assert_eq!(out.status.code(), want, "stdout {what}: {stderr}");
        if k == 1 {
            assert!(stderr.contains("pushed, but the reference was not printed: writing to standard output"), "{stderr}");
        }
        let answer = registry.get(&format!("/v2/team/coverage/manifests/{tag}"), &[&format!("accept: {MANIFEST_TYPE}")]);
        assert_eq!(answer.header("docker-content-digest"), Some(digest.as_str()), "stdout {what}");
    }

    // HTTPS to a registry that speaks plain HTTP.
    let stderr = push_fails(&dir, &[path_arg(&folder), &reference], &[]);
    assert!(stderr.contains(&format!("no TLS with the registry at {}", registry.address)), "{stderr}");
    assert!(stderr.contains("add --plain-http"), "{stderr}");
}

/// A CA and a certificate for 127.0.0.1 signed by it: (ca.pem, cert.pem, key.pem).
fn make_certificates(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let [ca_key, ca, key, csr, cert, ext] =
        ["ca.key", "ca.pem", "key.pem", "cert.csr", "cert.pem", "ext.cnf"].map(|name| path_arg(&dir.join(name)).to_owned());
    let ca_subject = ["-subj", "/CN=livecov test CA", "-days", "2"];
    run(
        "openssl",
        &[&["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", &ca_key, "-out", &ca][..], &ca_subject].concat(),
    );
    run("openssl", &["req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", &key, "-out", &csr]);
    // An IP address in subjectAltName: clients check it, not the CN.
    std::fs::write(&ext, "subjectAltName = IP:127.0.0.1\nbasicConstraints = CA:FALSE\n").unwrap();
    run(
        "openssl",
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &ext,
            "-out",
            &cert,
        ],
    );
    (ca.into(), cert.into(), key.into())
}

/// A Docker config.json with the login of `registry`, as `docker login` writes it.
fn auth_config(path: &Path, registry: &str, user: &str, password: &str) -> PathBuf {
    let auth = String::from_utf8(run("sh", &["-c", &format!("printf %s '{user}:{password}' | base64 -w0")])).unwrap();
    let config = serde_json::json!({ "auths": { registry: { "auth": auth } } });
    std::fs::write(path, serde_json::to_string_pretty(&config).unwrap()).unwrap();
    path.to_path_buf()
}

#[test]
fn a_push_over_tls_logs_in_and_a_refused_login_says_where_it_came_from() {
    let dir = scratch("push", "tls");
    let (ca, cert, key) = make_certificates(&dir);
    let htpasswd = dir.join("htpasswd");
    std::fs::write(&htpasswd, run("htpasswd", &["-Bbn", "ci", "s3cret pass"])).unwrap();
    let registry = Registry::start(&dir, Auth::Htpasswd(&htpasswd), Some((&cert, &key)));
    let address = registry.address.clone();
    let folder = dir.join("out");
    let files = collect_folder(&folder);
    let reference = format!("{address}/coverage/service:abc123");
    let good = auth_config(&dir.join("good.json"), &address, "ci", "s3cret pass");
    let wrong = auth_config(&dir.join("wrong.json"), &address, "ci", "not the password");
    let trust = [("SSL_CERT_FILE", path_arg(&ca))];

    let (stdout, stderr) = push_ok(&dir, &["--registry-config", path_arg(&good), path_arg(&folder), &reference], &trust);
    assert!(stdout.starts_with(&format!("{address}/coverage/service@sha256:")), "{stdout}");
    assert_eq!(stderr.matches(": uploaded").count() + stderr.matches(": already there").count(), files.len(), "{stderr}");

    // skopeo, with the same config.json and the CA, reads the artifact.
    let certs = dir.join("certs");
    std::fs::create_dir_all(&certs).unwrap();
    std::fs::copy(&ca, certs.join("ca.crt")).unwrap();
    let raw = run(
        "skopeo",
        &["inspect", "--raw", "--authfile", path_arg(&good), "--cert-dir", path_arg(&certs), &format!("docker://{reference}")],
    );
    let manifest: serde_json::Value = serde_json::from_slice(&raw).expect("a JSON manifest");
    check_artifact(&manifest);
    assert_eq!(
        layers(&manifest).iter().map(|l| l.0.clone()).collect::<Vec<_>>(),
        files.iter().map(|f| f.0.clone()).collect::<Vec<_>>()
    );

    // The config from REGISTRY_AUTH_FILE, and from $DOCKER_CONFIG/config.json.
    let from_env = [trust[0], ("REGISTRY_AUTH_FILE", path_arg(&good))];
    assert_eq!(push_ok(&dir, &[path_arg(&folder), &reference], &from_env).0, stdout);
    let docker_config = dir.join("docker");
    std::fs::create_dir_all(&docker_config).unwrap();
    auth_config(&docker_config.join("config.json"), &address, "ci", "s3cret pass");
    let from_dir = [trust[0], ("DOCKER_CONFIG", path_arg(&docker_config))];
    assert_eq!(push_ok(&dir, &[path_arg(&folder), &reference], &from_dir).0, stdout);

    // A wrong password: the file and the key it was looked up under.
    let stderr = push_fails(&dir, &["--registry-config", path_arg(&wrong), path_arg(&folder), &reference], &trust);
    assert!(stderr.contains(&format!("the registry {address} refused the login of \"ci\" from {}", wrong.display())), "{stderr}");
    assert!(stderr.contains(&format!("auths.\"{address}\"")), "{stderr}");
    // No login at all.
    let stderr = push_fails(&dir, &[path_arg(&folder), &reference], &trust);
    assert!(stderr.contains(&format!("the registry {address} asks for a login")), "{stderr}");
    assert!(stderr.contains(&format!("{}/.docker/config.json does not exist", dir.display())), "{stderr}");
    // A --registry-config that is not there.
    let stderr =
        push_fails(&dir, &["--registry-config", path_arg(&dir.join("nope.json")), path_arg(&folder), &reference], &trust);
    assert!(stderr.contains("cannot read the registry config") && stderr.contains("nope.json"), "{stderr}");

    // The test's CA not trusted.
    let stderr = push_fails(&dir, &["--registry-config", path_arg(&good), path_arg(&folder), &reference], &[]);
    assert!(stderr.contains(&format!("the certificate of the registry at {address} is not trusted")), "{stderr}");
    assert!(stderr.contains("SSL_CERT_FILE"), "{stderr}");
    // Plain HTTP to a registry that speaks HTTPS.
    let stderr = push_fails(&dir, &["--plain-http", "--registry-config", path_arg(&good), path_arg(&folder), &reference], &[]);
    assert!(stderr.contains(&format!("the registry at {address} speaks HTTPS")), "{stderr}");
    assert!(stderr.contains("leave out --plain-http"), "{stderr}");
}

#[test]
fn an_unreachable_registry_a_missing_folder_and_a_bad_reference_are_errors_that_say_what_to_do() {
    let dir = scratch("push", "errors");
    let folder = dir.join("out");
    collect_folder(&folder);
    // A port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let stderr = push_fails(&dir, &["--plain-http", path_arg(&folder), &format!("{closed}/coverage:v1")], &[]);
    assert!(stderr.contains(&format!("cannot reach the registry at {closed}: connection refused")), "{stderr}");

    let stderr = push_fails(&dir, &["--plain-http", path_arg(&dir.join("missing")), &format!("{closed}/coverage:v1")], &[]);
    assert!(stderr.contains("missing: no such folder"), "{stderr}");
    let stderr = push_fails(&dir, &["--plain-http", path_arg(&folder.join("instances")), &format!("{closed}/coverage:v1")], &[]);
    assert!(stderr.contains("instances has no merged.lcov"), "{stderr}");

    for bad in ["coverage:v1", "team/coverage:v1", "localhost:5000/coverage", "localhost:5000/Coverage:v1"] {
        let out = push(&dir, &[path_arg(&folder), bad], &[]);
        assert_eq!(out.status.code(), Some(2), "{bad}: {out:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("REGISTRY/REPO:TAG"), "{bad}: {out:?}");
    }
}

/// A token service: answers `GET /token?...` with `token` when the request
/// carries `Authorization: Basic <login>`, else 401; the query of every
/// request it saw.
fn token_service(login: &str, token: String) -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the token service");
    let realm = format!("http://{}/token", listener.local_addr().unwrap());
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let expected =
        format!("basic {}", String::from_utf8(run("sh", &["-c", &format!("printf %s '{login}' | base64 -w0")])).unwrap());
    let queries = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(&stream);
            let mut request_line = String::new();
            let _ = reader.read_line(&mut request_line);
            let mut authorized = false;
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                authorized |= line.trim().to_ascii_lowercase() == format!("authorization: {}", expected.to_ascii_lowercase());
                line.clear();
            }
            let target = request_line.split_whitespace().nth(1).unwrap_or("").to_owned();
            queries.lock().unwrap().push(target);
            let reply = if authorized {
                let body = format!("{{\"token\":\"{token}\",\"expires_in\":3600}}");
                format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                )
            } else {
                "HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_owned()
            };
            let _ = (&stream).write_all(reply.as_bytes());
        }
    });
    (realm, seen)
}

/// A JWT as distribution's token authentication takes it: RS256, signed by
/// `key`, with `cert` (a root of the registry's rootcertbundle) in x5c,
/// granting pull and push on `repository`.
fn registry_token(key: &Path, cert: &Path, issuer: &str, service: &str, repository: &str) -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let der = String::from_utf8(run("sh", &["-c", &format!("openssl x509 -in '{}' -outform DER | base64 -w0", cert.display())]))
        .unwrap();
    let header = serde_json::json!({ "alg": "RS256", "typ": "JWT", "x5c": [der] });
    let claims = serde_json::json!({
        "iss": issuer, "sub": "ci", "aud": service, "exp": now + 3600, "nbf": now - 60, "iat": now - 60, "jti": "livecov-test",
        "access": [{ "type": "repository", "name": repository, "actions": ["pull", "push"] }],
    });
    let script = format!(
        "b64url() {{ base64 -w0 | tr '+/' '-_' | tr -d '='; }}; input=\"$(printf %s '{}' | b64url).$(printf %s '{}' | b64url)\"; \
         printf %s \"$input.$(printf %s \"$input\" | openssl dgst -sha256 -sign '{}' | b64url)\"",
        header,
        claims,
        key.display()
    );
    String::from_utf8(run("sh", &["-c", &script])).unwrap()
}

#[test]
fn a_registry_with_a_token_service_gets_the_login_there_and_takes_the_bearer_token() {
    let dir = scratch("push", "token");
    let (ca, _, _) = make_certificates(&dir);
    let (issuer, service, repository) = ("livecov-test-issuer", "livecov-test-registry", "coverage/tokens");
    let token = registry_token(&dir.join("ca.key"), &ca, issuer, service, repository);
    let (realm, seen) = token_service("ci:tok3n", token.clone());
    let registry = Registry::start(&dir, Auth::Token { realm: &realm, service, issuer, roots: &ca }, None);
    let address = registry.address.clone();
    let folder = dir.join("out");
    let files = collect_folder(&folder);
    let reference = format!("{address}/{repository}:v1");
    let good = auth_config(&dir.join("good.json"), &address, "ci", "tok3n");
    let wrong = auth_config(&dir.join("wrong.json"), &address, "ci", "nope");

    let (stdout, _) = push_ok(&dir, &["--plain-http", "--registry-config", path_arg(&good), path_arg(&folder), &reference], &[]);
    // The token was asked for the registry's service, to pull and push the repository.
    let queries = seen.lock().unwrap().clone();
    assert!(!queries.is_empty());
    for q in &queries {
        assert_eq!(q, "/token?service=livecov-test-registry&scope=repository%3Acoverage%2Ftokens%3Apull%2Cpush", "{queries:?}");
    }
    let digest = stdout.trim().rsplit_once('@').expect("REGISTRY/REPO@DIGEST").1.to_owned();
    let answer = registry.get(
        &format!("/v2/{repository}/manifests/v1"),
        &[&format!("accept: {MANIFEST_TYPE}"), &format!("authorization: Bearer {token}")],
    );
    assert_eq!(answer.status, 200, "{}", String::from_utf8_lossy(&answer.body));
    assert_eq!(answer.header("docker-content-digest"), Some(digest.as_str()));
    check_artifact(&answer.json());
    assert_eq!(layers(&answer.json()).len(), files.len());

    let stderr = push_fails(&dir, &["--plain-http", "--registry-config", path_arg(&wrong), path_arg(&folder), &reference], &[]);
    assert!(stderr.contains(&format!("the registry {address} refused the login of \"ci\" from {}", wrong.display())), "{stderr}");
    let stderr = push_fails(&dir, &["--plain-http", path_arg(&folder), &reference], &[]);
    assert!(stderr.contains(&format!("the registry {address} asks for a login")), "{stderr}");
}
