//! `livecov push`: a folder `livecov collect` wrote (merged.lcov,
//! instances/, manifest.json, and any file beside them, such as a Cobertura
//! report) to an OCI registry as one artifact, so that CI keeps the
//! coverage of a build where it keeps the build's images, and `oras pull`
//! (or any OCI client) gives the files back.
//!
//! The artifact is an OCI image manifest 1.1 of artifactType
//! [`ARTIFACT_TYPE`] with the empty config, one layer per file, titled
//! (`org.opencontainers.image.title`) with its path in the folder, which is
//! how oras names the files it pulls.
//!
//! The distribution API is written by hand over hyper: a push is a handful
//! of requests (blob HEAD, upload POST and PUT, manifest PUT, a token GET),
//! and the OCI client crates bring a second HTTP stack (reqwest) into a
//! binary that has hyper already. Credentials come from a Docker
//! config.json (`auths`), sent as Basic or traded for a Bearer token as the
//! registry's challenge asks, as docker, podman and oras do.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use base64::Engine as _;
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{
    HeaderMap, HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, HOST, LOCATION, WWW_AUTHENTICATE,
};
use hyper::{Method, Request, StatusCode};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::rustls;

use crate::client::ExchangeError;
use crate::stderr::say;

/// The artifactType of the manifests `livecov push` writes.
pub const ARTIFACT_TYPE: &str = "application/vnd.livecov.coverage.v1+json";
const MANIFEST_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
const EMPTY_TYPE: &str = "application/vnd.oci.empty.v1+json";
const TITLE: &str = "org.opencontainers.image.title";

/// Connecting (and the TLS handshake) gives up after this long: a registry
/// that does not answer by then is not there.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// One request, its upload included: generous for a large folder on a slow
/// link, yet a registry that stops answering does not hang CI for ever.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(600);
/// A registry's answers are small JSON documents (errors, tokens).
const MAX_ANSWER: usize = 1 << 20;

#[derive(clap::Args, Debug)]
#[command(
    about = "Push a collect folder to an OCI registry as an artifact",
    long_about = "Push a folder `livecov collect` wrote (merged.lcov, instances/, manifest.json and any \
                  other file in it, e.g. a Cobertura report) to an OCI registry as one artifact: an OCI \
                  image manifest of artifactType application/vnd.livecov.coverage.v1+json, one layer \
                  per file titled with its path in the folder, so that `oras pull` recreates the files. \
                  Credentials come from a Docker config.json: --registry-config, else \
                  $REGISTRY_AUTH_FILE, else $DOCKER_CONFIG/config.json, else ~/.docker/config.json \
                  (auths.<registry>.auth, as `docker login` and `podman login` write it). HTTPS trusts \
                  the system's CA certificates, or the PEM file SSL_CERT_FILE names. Prints \
                  REGISTRY/REPO@DIGEST of the pushed manifest.",
    after_help = "Examples:\n  \
                  livecov push coverage/e2e registry.example/team/coverage:build-42\n  \
                  livecov push --registry-config ci-auth.json out registry.example:5000/coverage/service:$GIT_COMMIT\n  \
                  livecov push --plain-http out localhost:5000/coverage:latest\n  \
                  oras pull registry.example/team/coverage:build-42 -o coverage/e2e"
)]
pub struct Args {
    /// Speak plain HTTP to the registry instead of HTTPS (a local registry without TLS).
    #[arg(long)]
    plain_http: bool,
    /// The Docker config.json with the registry's login (auths.<registry>.auth,
    /// base64 of USER:PASSWORD).
    #[arg(long, value_name = "PATH")]
    registry_config: Option<PathBuf>,
    /// The folder to push: `livecov collect`'s output (it must have merged.lcov).
    #[arg(value_name = "DIR")]
    dir: PathBuf,
    /// Where: the registry's host (and port), the repository and a tag.
    #[arg(value_name = "REGISTRY/REPO:TAG", value_parser = Reference::parse)]
    reference: Reference,
}

pub fn run(args: Args) -> Result<()> {
    let files = list_folder(&args.dir)?;
    let credentials = Credentials::find(args.registry_config.as_deref(), &args.reference.registry)?;
    let port = args.reference.port.unwrap_or(if args.plain_http { 80 } else { 443 });
    let endpoint = Endpoint { tls: !args.plain_http, host: args.reference.host.clone(), port };
    let mut registry =
        Registry { endpoint, repository: args.reference.repository.clone(), credentials, authorization: None, tls: None };
    let digest = crate::client::block_on(registry.push(&files, &args.reference.tag)).context("cannot start the runtime")??;
    say(format_args!("livecov: pushed {} file(s) to {}", files.len(), args.reference));
    // As every command's result (a reader gone ends it quietly): the
    // reference is pushed whether or not it can be printed.
    let line = format!("{}/{}@{digest}\n", args.reference.registry, args.reference.repository);
    crate::output::write_output(None, line.as_bytes()).context("pushed, but the reference was not printed")
}

// ---------------------------------------------------------------- the reference

/// `REGISTRY/REPO:TAG`: the registry's host as written (for the config's
/// `auths` key), split into host and port for connecting.
#[derive(Debug, Clone)]
pub struct Reference {
    registry: String,
    host: String,
    port: Option<u16>,
    repository: String,
    tag: String,
}

impl Reference {
    pub fn parse(s: &str) -> Result<Reference, String> {
        let example = "e.g. registry.example:5000/team/coverage:build-42";
        let (registry, rest) = s.split_once('/').ok_or_else(|| format!("{s:?} is not REGISTRY/REPO:TAG ({example})"))?;
        // As docker tells a registry from a Docker Hub user: a dot, a port or localhost.
        if !(registry.contains(['.', ':']) || registry == "localhost") {
            return Err(format!(
                "{s:?} does not start with a registry's host: give it first, with its port if not the default \
                 ({example}; localhost:5000/coverage:latest for a local registry)"
            ));
        }
        if rest.contains('@') {
            return Err(format!("{s:?}: push names a tag, not a digest ({example})"));
        }
        let (repository, tag) = rest.rsplit_once(':').ok_or_else(|| format!("{s:?} has no tag: add :TAG ({example})"))?;
        let component_ok = |c: &str| {
            c.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-'))
                && c.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
                && c.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
        };
        if !repository.split('/').all(component_ok) {
            return Err(format!(
                "{repository:?} is not a repository name: lowercase letters, digits and . _ - between them, \
                 folders separated by / ({example})"
            ));
        }
        let tag_ok = (1..=128).contains(&tag.len())
            && tag.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
            && !tag.starts_with(['.', '-']);
        if !tag_ok {
            return Err(format!(
                "{tag:?} is not a tag: up to 128 letters, digits, . _ and -, not starting with . or - ({example})"
            ));
        }
        let (host, port) = split_authority(registry)
            .ok_or_else(|| format!("{registry:?}: the port is not a number from 1 to 65535 ({example})"))?;
        Ok(Reference {
            registry: registry.to_owned(),
            host: host.to_owned(),
            port,
            repository: repository.to_owned(),
            tag: tag.to_owned(),
        })
    }
}

/// `host`, `host:port`, `[v6]` or `[v6]:port`; `None` for a bad port.
fn split_authority(authority: &str) -> Option<(&str, Option<u16>)> {
    let (host, port) = match authority.strip_prefix('[') {
        Some(v6) => {
            let (host, after) = v6.split_once(']')?;
            match after {
                "" => (host, None),
                p => (host, Some(p.strip_prefix(':')?)),
            }
        }
        None => match authority.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        },
    };
    let port = match port {
        Some(p) => Some(p.parse::<u16>().ok().filter(|&p| p != 0)?),
        None => None,
    };
    (!host.is_empty()).then_some((host, port))
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}:{}", self.registry, self.repository, self.tag)
    }
}

// ---------------------------------------------------------------- the folder

/// A file to push: its path in the folder (the layer's title) and its own path.
#[derive(Debug)]
struct File {
    title: String,
    path: PathBuf,
}

/// Every file in `dir`, sorted by title; `dir` must be a collect folder.
fn list_folder(dir: &Path) -> Result<Vec<File>> {
    match std::fs::metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("{}: no such folder: give the folder `livecov collect -o` wrote", dir.display())
        }
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", dir.display())),
        Ok(m) if !m.is_dir() => bail!("{} is not a folder: give the folder `livecov collect -o` wrote", dir.display()),
        Ok(_) => {}
    }
    if !dir.join("merged.lcov").is_file() {
        bail!(
            "{} has no merged.lcov: is it a folder `livecov collect -o` wrote? (push sends a collection: \
             merged.lcov, instances/, manifest.json and the files beside them)",
            dir.display()
        );
    }
    let mut files = Vec::new();
    let mut folders = vec![(dir.to_path_buf(), String::new())];
    while let Some((folder, prefix)) = folders.pop() {
        for entry in std::fs::read_dir(&folder).with_context(|| format!("cannot read the folder {}", folder.display()))? {
            let entry = entry.with_context(|| format!("cannot read the folder {}", folder.display()))?;
            let path = entry.path();
            let name = entry.file_name();
            let name = name.to_str().ok_or_else(|| {
                anyhow!("{}: the name is not UTF-8, which a layer's title cannot carry: rename it", path.display())
            })?;
            let title = format!("{prefix}{name}");
            let kind = entry.file_type().with_context(|| format!("cannot read {}", path.display()))?;
            // A link to a folder is not followed: it could lead back up.
            if kind.is_dir() {
                folders.push((path, format!("{title}/")));
            } else if std::fs::metadata(&path).with_context(|| format!("cannot read {}", path.display()))?.is_file() {
                files.push(File { title, path });
            }
        }
    }
    files.sort_by(|a, b| a.title.cmp(&b.title));
    Ok(files)
}

/// The layer media type of a file, by its name's extension.
fn media_type(title: &str) -> &'static str {
    match title.rsplit_once('.').map(|(_, ext)| ext) {
        Some("lcov" | "info") => "text/x-lcov",
        Some("json") => "application/json",
        Some("xml") => "application/xml",
        Some("md") => "text/markdown",
        Some("txt") => "text/plain",
        Some("html") => "text/html",
        _ => "application/octet-stream",
    }
}

fn sha256(data: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, data);
    let mut text = String::with_capacity(7 + 64);
    text.push_str("sha256:");
    for b in digest.as_ref() {
        text.push_str(&format!("{b:02x}"));
    }
    text
}

// ---------------------------------------------------------------- credentials

/// The login for one registry, and where it was looked for (for errors).
#[derive(Debug)]
struct Credentials {
    /// The config file read, or the one looked for when there is none.
    config: PathBuf,
    found_config: bool,
    /// The registry as `auths` is searched for it.
    key: String,
    login: Option<(String, String)>,
}

impl Credentials {
    /// `--registry-config`, else `REGISTRY_AUTH_FILE`, else
    /// `$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`. The first
    /// two must exist, being asked for; the others may be missing (no
    /// login: the registry may take anonymous pushes).
    fn find(explicit: Option<&Path>, registry: &str) -> Result<Credentials> {
        let variable = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        let (config, required) = match (explicit, variable("REGISTRY_AUTH_FILE"), variable("DOCKER_CONFIG"), variable("HOME")) {
            (Some(path), ..) => (path.to_path_buf(), Some("--registry-config")),
            (None, Some(path), ..) => (path, Some("REGISTRY_AUTH_FILE")),
            (None, None, Some(dir), _) => (dir.join("config.json"), None),
            (None, None, None, Some(home)) => (home.join(".docker/config.json"), None),
            (None, None, None, None) => (PathBuf::from("~/.docker/config.json"), None),
        };
        let key = registry.to_ascii_lowercase();
        let text = match std::fs::read(&config) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && required.is_none() => {
                return Ok(Credentials { config, found_config: false, key, login: None });
            }
            Err(e) => {
                let by = required.map_or(String::new(), |by| format!(" (from {by})"));
                return Err(e).with_context(|| format!("cannot read the registry config {}{by}", config.display()));
            }
        };
        let json: serde_json::Value = serde_json::from_slice(&text).with_context(|| {
            format!("{} is not JSON: a registry config is a Docker config.json, as `docker login` writes it", config.display())
        })?;
        let login = Self::login_in(&json, &key).map_err(|e| anyhow!("{}: {e}", config.display()))?;
        Ok(Credentials { config, found_config: true, key, login })
    }

    /// The login of `auths` whose key is `key`, written as docker and
    /// podman write it: `host:port`, or a URL of it (`https://host/v1/`).
    fn login_in(json: &serde_json::Value, key: &str) -> Result<Option<(String, String)>, String> {
        let entry = json.get("auths").and_then(|a| a.as_object()).and_then(|auths| {
            auths.iter().find_map(|(k, v)| {
                let host = k.trim_start_matches("https://").trim_start_matches("http://");
                let host = host.split('/').next().unwrap_or(host);
                host.eq_ignore_ascii_case(key).then_some((k, v))
            })
        });
        let helper = json.get("credHelpers").and_then(|h| h.get(key)).or_else(|| json.get("credsStore")).and_then(|h| h.as_str());
        let kept_by = |helper: &str| {
            format!(
                "the login of {key} is kept by the credential helper docker-credential-{helper}, which livecov does not \
                 run: give --registry-config a config.json with auths.\"{key}\".auth (base64 of USER:PASSWORD)"
            )
        };
        let Some((k, entry)) = entry else {
            return match helper {
                Some(helper) => Err(kept_by(helper)),
                None => Ok(None),
            };
        };
        if let Some(auth) = entry.get("auth").and_then(|a| a.as_str()).filter(|a| !a.is_empty()) {
            let bad = || format!("auths.\"{k}\".auth is not base64 of USER:PASSWORD: write it again (`docker login {key}`)");
            let decoded = base64::engine::general_purpose::STANDARD.decode(auth.trim()).map_err(|_| bad())?;
            let decoded = String::from_utf8(decoded).map_err(|_| bad())?;
            let (user, password) = decoded.split_once(':').ok_or_else(bad)?;
            return Ok(Some((user.to_owned(), password.to_owned())));
        }
        let field = |name: &str| entry.get(name).and_then(|v| v.as_str()).filter(|v| !v.is_empty());
        match (field("username"), field("password")) {
            (Some(user), Some(password)) => Ok(Some((user.to_owned(), password.to_owned()))),
            _ => Err(match helper {
                Some(helper) => kept_by(helper),
                None => format!("auths.\"{k}\" has no auth (base64 of USER:PASSWORD): write it again (`docker login {key}`)"),
            }),
        }
    }

    fn basic(&self) -> Option<String> {
        let (user, password) = self.login.as_ref()?;
        Some(format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))))
    }

    /// The error for a registry that asked for a login and refused ours, or
    /// that we had none for.
    fn refused(&self, registry: &str) -> anyhow::Error {
        match (&self.login, self.found_config) {
            (Some((user, _)), _) => anyhow!(
                "the registry {registry} refused the login of {user:?} from {} (auths.\"{}\"): check the user and \
                 the password there (`docker login {registry}` writes them), and that the user may push to this repository",
                self.config.display(),
                self.key
            ),
            (None, true) => anyhow!(
                "the registry {registry} asks for a login, and {} has none for it (auths.\"{}\"): run `docker login \
                 {registry}`, or give --registry-config a config.json with auths.\"{}\".auth (base64 of USER:PASSWORD)",
                self.config.display(),
                self.key,
                self.key
            ),
            (None, false) => anyhow!(
                "the registry {registry} asks for a login, and there is no registry config ({} does not exist): \
                 run `docker login {registry}`, or give --registry-config a config.json with auths.\"{}\".auth \
                 (base64 of USER:PASSWORD)",
                self.config.display(),
                self.key
            ),
        }
    }
}

// ---------------------------------------------------------------- HTTP

/// Where a request goes: the registry, or its token service.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Endpoint {
    tls: bool,
    host: String,
    port: u16,
}

impl Endpoint {
    fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// `location` (absolute, or a path on this endpoint) as an endpoint and a path.
    fn resolve(&self, location: &str) -> Result<(Endpoint, String)> {
        let (tls, rest) = match (location.strip_prefix("https://"), location.strip_prefix("http://")) {
            (Some(rest), _) => (true, rest),
            (None, Some(rest)) => (false, rest),
            (None, None) if location.starts_with('/') => return Ok((self.clone(), location.to_owned())),
            (None, None) => bail!("the registry {} sent a location livecov cannot follow: {location:?}", self.authority()),
        };
        let (authority, path) = rest.find('/').map_or((rest, "/"), |i| rest.split_at(i));
        let (host, port) = split_authority(authority)
            .ok_or_else(|| anyhow!("the registry {} sent a location livecov cannot follow: {location:?}", self.authority()))?;
        let port = port.unwrap_or(if tls { 443 } else { 80 });
        Ok((Endpoint { tls, host: host.to_owned(), port }, path.to_owned()))
    }
}

#[derive(Debug)]
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Answer {
    fn header(&self, name: hyper::header::HeaderName) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The registry's own words: the messages of its `errors`, else the body.
    fn message(&self) -> String {
        let text = String::from_utf8_lossy(&self.body);
        if let Ok(json) = serde_json::from_str::<serde_json::Value>(&text) {
            if let Some(errors) = json.get("errors").and_then(|e| e.as_array()) {
                let messages: Vec<String> = errors
                    .iter()
                    .map(|e| {
                        let field = |n: &str| e.get(n).and_then(|v| v.as_str()).unwrap_or("");
                        format!("{} {}", field("code"), field("message")).trim().to_owned()
                    })
                    .collect();
                if !messages.is_empty() {
                    return messages.join("; ");
                }
            }
        }
        text.trim().chars().take(300).collect()
    }
}

struct Registry {
    endpoint: Endpoint,
    repository: String,
    credentials: Credentials,
    /// The `Authorization` the registry accepted (Basic, or a Bearer
    /// token), once it asked for one.
    authorization: Option<String>,
    tls: Option<tokio_rustls::TlsConnector>,
}

impl Registry {
    /// Pushes every file, then the manifest under `tag`; its digest.
    async fn push(&mut self, files: &[File], tag: &str) -> Result<String> {
        self.ping().await?;
        let empty = Bytes::from_static(b"{}");
        let config = serde_json::json!({ "mediaType": EMPTY_TYPE, "digest": sha256(&empty), "size": empty.len() });
        self.blob(&empty, &sha256(&empty)).await.context("cannot push the empty config blob")?;
        let mut layers = Vec::with_capacity(files.len());
        for file in files {
            let data = Bytes::from(std::fs::read(&file.path).with_context(|| format!("cannot read {}", file.path.display()))?);
            let digest = sha256(&data);
            let uploaded = self.blob(&data, &digest).await.with_context(|| format!("cannot push {}", file.title))?;
            let how = if uploaded { "uploaded" } else { "already there" };
            say(format_args!("livecov: {} ({} bytes): {how}", file.title, data.len()));
            layers.push(serde_json::json!({
                "mediaType": media_type(&file.title),
                "digest": digest,
                "size": data.len(),
                "annotations": { TITLE: file.title },
            }));
        }
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "artifactType": ARTIFACT_TYPE,
            "config": config,
            "layers": layers,
        });
        let manifest = Bytes::from(serde_json::to_vec(&manifest).expect("JSON of strings and numbers"));
        let path = format!("/v2/{}/manifests/{tag}", self.repository);
        let endpoint = self.endpoint.clone();
        let answer = self.send(Method::PUT, &endpoint, &path, Some(MANIFEST_TYPE), manifest.clone()).await?;
        if answer.status != StatusCode::CREATED {
            return Err(self.unexpected(&answer, "the manifest's PUT"));
        }
        Ok(sha256(&manifest))
    }

    /// `GET /v2/`, as registry clients begin: whether this is a registry,
    /// over the right protocol, and the login it asks for, before any upload.
    async fn ping(&mut self) -> Result<()> {
        let endpoint = self.endpoint.clone();
        let answer = self.send(Method::GET, &endpoint, "/v2/", None, Bytes::new()).await?;
        match answer.status {
            StatusCode::OK => Ok(()),
            StatusCode::NOT_FOUND => bail!(
                "{} answers, but not as an OCI registry (no /v2/): is it the registry's host and port?",
                self.endpoint.authority()
            ),
            _ => Err(self.unexpected(&answer, "GET /v2/")),
        }
    }

    /// Uploads a blob unless the registry has it: whether it was uploaded.
    async fn blob(&mut self, data: &Bytes, digest: &str) -> Result<bool> {
        let endpoint = self.endpoint.clone();
        let blob = format!("/v2/{}/blobs/{digest}", self.repository);
        let answer = self.send(Method::HEAD, &endpoint, &blob, None, Bytes::new()).await?;
        match answer.status {
            StatusCode::OK => return Ok(false),
            StatusCode::NOT_FOUND => {}
            _ => return Err(self.unexpected(&answer, "a blob's HEAD")),
        }
        let uploads = format!("/v2/{}/blobs/uploads/", self.repository);
        let answer = self.send(Method::POST, &endpoint, &uploads, None, Bytes::new()).await?;
        let location = match (answer.status, answer.header(LOCATION)) {
            (StatusCode::ACCEPTED, Some(location)) => location.to_owned(),
            _ => return Err(self.unexpected(&answer, "the upload's POST")),
        };
        let (at, mut path) = self.endpoint.resolve(&location)?;
        path.push(if path.contains('?') { '&' } else { '?' });
        path.push_str("digest=");
        path.push_str(&digest.replace(':', "%3A"));
        let answer = self.send(Method::PUT, &at, &path, Some("application/octet-stream"), data.clone()).await?;
        if answer.status != StatusCode::CREATED {
            return Err(self.unexpected(&answer, "the upload's PUT"));
        }
        Ok(true)
    }

    fn unexpected(&self, answer: &Answer, what: &str) -> anyhow::Error {
        anyhow!("the registry {} answered {} to {what}: {}", self.endpoint.authority(), answer.status, answer.message())
    }

    /// A request to the registry, authorized as it asks: on a 401 the
    /// login is sent (Basic, or traded for a Bearer token) and the request
    /// made again; a 401 then is a refused login.
    async fn send(
        &mut self,
        method: Method,
        at: &Endpoint,
        path: &str,
        content_type: Option<&str>,
        body: Bytes,
    ) -> Result<Answer> {
        let mut retried = false;
        loop {
            // Credentials go to the registry only, not to a storage host an upload location may name.
            let authorization = self.authorization.clone().filter(|_| *at == self.endpoint);
            let answer = self.exchange(method.clone(), at, path, content_type, authorization.as_deref(), body.clone()).await?;
            if answer.status != StatusCode::UNAUTHORIZED || *at != self.endpoint {
                return Ok(answer);
            }
            if retried {
                return Err(self.credentials.refused(&self.endpoint.authority()));
            }
            self.authorize(&answer).await?;
            retried = true;
        }
    }

    /// Answers a 401's `WWW-Authenticate` challenge: Basic with the login,
    /// or a Bearer token from the realm, asked with the login (anonymous
    /// without one) for pull and push on the repository.
    async fn authorize(&mut self, answer: &Answer) -> Result<()> {
        let registry = self.endpoint.authority();
        let challenge = answer.header(WWW_AUTHENTICATE).unwrap_or("");
        let (scheme, params) = parse_challenge(challenge);
        if scheme.eq_ignore_ascii_case("basic") {
            self.authorization = Some(self.credentials.basic().ok_or_else(|| self.credentials.refused(&registry))?);
            return Ok(());
        }
        if !scheme.eq_ignore_ascii_case("bearer") {
            bail!(
                "the registry {registry} asks for an authentication livecov does not speak: {challenge:?} (Basic and Bearer are)"
            );
        }
        let param = |name: &str| params.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str());
        let realm = param("realm")
            .ok_or_else(|| anyhow!("the registry {registry} asks for a Bearer token without a realm: {challenge:?}"))?;
        let (at, mut path) = self.endpoint.resolve(realm)?;
        let scope = format!("repository:{}:pull,push", self.repository);
        path.push(if path.contains('?') { '&' } else { '?' });
        if let Some(service) = param("service") {
            path.push_str(&format!("service={}&", query_encode(service)));
        }
        path.push_str(&format!("scope={}", query_encode(&scope)));
        let basic = self.credentials.basic();
        let token = self.exchange(Method::GET, &at, &path, None, basic.as_deref(), Bytes::new()).await?;
        match token.status {
            StatusCode::OK => {}
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => return Err(self.credentials.refused(&registry)),
            status => {
                bail!("the token service {} of the registry {registry} answered {status}: {}", at.authority(), token.message())
            }
        }
        let json: serde_json::Value = serde_json::from_slice(&token.body)
            .map_err(|_| anyhow!("the token service {} of the registry {registry} answered with no JSON", at.authority()))?;
        let token = ["token", "access_token"]
            .iter()
            .find_map(|k| json.get(k).and_then(|t| t.as_str()).filter(|t| !t.is_empty()))
            .ok_or_else(|| anyhow!("the token service {} of the registry {registry} answered with no token", at.authority()))?;
        self.authorization = Some(format!("Bearer {token}"));
        Ok(())
    }

    /// One request on a connection of its own, bounded in time; errors
    /// say whether the registry was not there or spoke the other protocol.
    async fn exchange(
        &mut self,
        method: Method,
        at: &Endpoint,
        path: &str,
        content_type: Option<&str>,
        authorization: Option<&str>,
        body: Bytes,
    ) -> Result<Answer> {
        let authority = at.authority();
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .header(HOST, &authority)
            .header(CONTENT_LENGTH, body.len())
            .header(ACCEPT, format!("{MANIFEST_TYPE}, application/json"));
        if let Some(content_type) = content_type {
            request = request.header(CONTENT_TYPE, content_type);
        }
        if let Some(authorization) = authorization {
            let value = HeaderValue::from_str(authorization)
                .map_err(|_| anyhow!("the login for {authority} holds characters a header cannot carry (control characters?)"))?;
            request = request.header(AUTHORIZATION, value);
        }
        let request = request.body(Full::new(body)).map_err(|e| anyhow!("cannot make a request to {authority}{path}: {e}"))?;
        let connector = if at.tls { Some(self.tls_connector()?) } else { None };
        let round = async {
            let tcp =
                match tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect((at.host.as_str(), at.port))).await {
                    Ok(Ok(tcp)) => tcp,
                    Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => bail!(
                        "cannot reach the registry at {authority}: connection refused (nothing listens there): is the \
                     registry running, and is {authority} its host and port?"
                    ),
                    Ok(Err(e)) => bail!("cannot reach the registry at {authority}: {e}: is {authority} its host and port?"),
                    Err(_) => bail!("cannot reach the registry at {authority}: no answer within {} s", CONNECT_TIMEOUT.as_secs()),
                };
            let _ = tcp.set_nodelay(true);
            match connector {
                None => {
                    let answer = over(tcp, request).await.map_err(|e| {
                        anyhow!(
                            "the registry at {authority} did not answer HTTP ({e}): if it speaks HTTPS, leave out --plain-http"
                        )
                    })?;
                    if answer.status == StatusCode::BAD_REQUEST && String::from_utf8_lossy(&answer.body).contains("HTTPS") {
                        bail!("the registry at {authority} speaks HTTPS, not plain HTTP: leave out --plain-http");
                    }
                    Ok(answer)
                }
                Some(connector) => {
                    let name = rustls::pki_types::ServerName::try_from(at.host.clone())
                        .map_err(|_| anyhow!("{:?} is not a host name TLS can check a certificate for", at.host))?;
                    let tls = match tokio::time::timeout(CONNECT_TIMEOUT, connector.connect(name, tcp)).await {
                        Ok(Ok(tls)) => tls,
                        Ok(Err(e)) => return Err(tls_error(&authority, e)),
                        Err(_) => bail!("no TLS handshake with {authority} within {} s", CONNECT_TIMEOUT.as_secs()),
                    };
                    over(tls, request).await.map_err(|e| anyhow!("the registry at {authority} did not answer HTTP over TLS: {e}"))
                }
            }
        };
        match tokio::time::timeout(REQUEST_TIMEOUT, round).await {
            Ok(answer) => answer,
            Err(_) => bail!("the registry at {authority} did not answer {path} within {} s", REQUEST_TIMEOUT.as_secs()),
        }
    }

    /// The TLS client, made once: the system's CA certificates, or those of
    /// the PEM file `SSL_CERT_FILE` names.
    fn tls_connector(&mut self) -> Result<tokio_rustls::TlsConnector> {
        if let Some(connector) = &self.tls {
            return Ok(connector.clone());
        }
        let found = rustls_native_certs::load_native_certs();
        let mut roots = rustls::RootCertStore::empty();
        let (added, _) = roots.add_parsable_certificates(found.certs);
        if added == 0 {
            let why: Vec<String> = found.errors.iter().map(|e| e.to_string()).collect();
            bail!(
                "no trusted CA certificate found{}: install the system's CA certificates (ca-certificates), or point \
                 SSL_CERT_FILE at a PEM file with the registry's CA",
                if why.is_empty() { String::new() } else { format!(" ({})", why.join("; ")) }
            );
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .context("cannot set up TLS")?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        self.tls = Some(connector.clone());
        Ok(connector)
    }
}

/// A failed TLS handshake, with what to do: trust the registry's CA, or
/// speak plain HTTP to a registry without TLS.
fn tls_error(authority: &str, e: std::io::Error) -> anyhow::Error {
    match e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) {
        Some(rustls::Error::InvalidCertificate(why)) => anyhow!(
            "the certificate of the registry at {authority} is not trusted ({why:?}): if the registry has a CA of its \
             own, point SSL_CERT_FILE at its PEM certificate"
        ),
        Some(other) => anyhow!(
            "no TLS with the registry at {authority} ({other}): if it speaks plain HTTP (a registry without TLS), add --plain-http"
        ),
        None => anyhow!(
            "no TLS with the registry at {authority} ({e}): if it speaks plain HTTP (a registry without TLS), add --plain-http"
        ),
    }
}

/// Sends `request` over `stream` and reads the answer (bounded).
async fn over<S>(stream: S, request: Request<Full<Bytes>>) -> Result<Answer, String>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    match crate::client::exchange(stream, request, MAX_ANSWER).await {
        Ok((parts, body)) => Ok(Answer { status: parts.status, headers: parts.headers, body }),
        Err(ExchangeError::Http(e)) => Err(e.to_string()),
        Err(ExchangeError::TooLarge) => Err(format!("an answer over {} KiB", MAX_ANSWER >> 10)),
    }
}

/// `Bearer realm="...",service="...",scope="..."`: the scheme and its
/// parameters (quoted strings unescaped).
fn parse_challenge(header: &str) -> (&str, Vec<(String, String)>) {
    let header = header.trim();
    let (scheme, rest) = header.split_once(' ').unwrap_or((header, ""));
    let mut params = Vec::new();
    let mut chars = rest.chars().peekable();
    loop {
        while chars.next_if(|c| *c == ',' || c.is_whitespace()).is_some() {}
        let key: String = std::iter::from_fn(|| chars.next_if(|c| *c != '=' && *c != ',')).collect();
        if key.is_empty() {
            break;
        }
        let mut value = String::new();
        if chars.next_if_eq(&'=').is_some() {
            if chars.next_if_eq(&'"').is_some() {
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => value.extend(chars.next()),
                        c => value.push(c),
                    }
                }
            } else {
                value = std::iter::from_fn(|| chars.next_if(|c| *c != ',')).collect::<String>().trim().to_owned();
            }
        }
        params.push((key.trim().to_owned(), value));
    }
    (scheme, params)
}

/// `s` for a URL's query: everything but unreserved characters escaped.
fn query_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_parse() {
        let r = Reference::parse("registry.example:5000/team/coverage:build-42").unwrap();
        assert_eq!(
            (r.host.as_str(), r.port, r.repository.as_str(), r.tag.as_str()),
            ("registry.example", Some(5000), "team/coverage", "build-42")
        );
        let r = Reference::parse("[::1]:5000/cov:v1").unwrap();
        assert_eq!((r.host.as_str(), r.port, r.registry.as_str()), ("::1", Some(5000), "[::1]:5000"));
        assert_eq!(Reference::parse("localhost/cov:v1").unwrap().port, None);
        for bad in [
            "cov:v1",
            "team/cov:v1",
            "r.example/cov",
            "r.example/Cov:v1",
            "r.example/cov:-x",
            "r.example:0/cov:v1",
            "r.example/cov@sha256:00",
            "r.example/a//b:v1",
        ] {
            assert!(Reference::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn locations_resolve_against_the_registry() {
        let registry = Endpoint { tls: true, host: "r.example".into(), port: 443 };
        let (at, path) = registry.resolve("/v2/a/blobs/uploads/123?_state=x").unwrap();
        assert_eq!((at, path.as_str()), (registry.clone(), "/v2/a/blobs/uploads/123?_state=x"));
        let (at, path) = registry.resolve("http://tokens:5001/auth").unwrap();
        assert_eq!((at, path.as_str()), (Endpoint { tls: false, host: "tokens".into(), port: 5001 }, "/auth"));
        let (at, path) = registry.resolve("https://[::1]").unwrap();
        assert_eq!((at, path.as_str()), (Endpoint { tls: true, host: "::1".into(), port: 443 }, "/"));
        assert!(registry.resolve("ftp://x/y").is_err());
        assert!(registry.resolve("http://x:0/y").is_err());
    }

    #[test]
    fn challenges_parse() {
        let (scheme, params) = parse_challenge(
            r#"Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull,push""#,
        );
        assert_eq!(scheme, "Bearer");
        assert_eq!(params[0], ("realm".to_owned(), "https://auth.example/token".to_owned()));
        assert_eq!(params[1], ("service".to_owned(), "registry.example".to_owned()));
        assert_eq!(params[2], ("scope".to_owned(), "repository:a/b:pull,push".to_owned()));
        let (scheme, params) = parse_challenge(r#"Basic realm="Registry Realm""#);
        assert_eq!((scheme, params[0].1.as_str()), ("Basic", "Registry Realm"));
    }

    #[test]
    fn logins_are_found_by_host() {
        let config = serde_json::json!({ "auths": {
            "https://registry.example:5000/v1/": { "auth": "dXNlcjpwYTpzcw==" },
            "other.example": { "username": "u", "password": "p" },
            "broken.example": { "auth": "not base64!" },
        }});
        assert_eq!(Credentials::login_in(&config, "registry.example:5000").unwrap(), Some(("user".into(), "pa:ss".into())));
        assert_eq!(Credentials::login_in(&config, "other.example").unwrap(), Some(("u".into(), "p".into())));
        assert_eq!(Credentials::login_in(&config, "registry.example").unwrap(), None);
        assert!(Credentials::login_in(&config, "broken.example").unwrap_err().contains("not base64"));
        let helper = serde_json::json!({ "auths": { "r.example": {} }, "credsStore": "desktop" });
        assert!(Credentials::login_in(&helper, "r.example").unwrap_err().contains("docker-credential-desktop"));
    }

    #[test]
    fn digests_and_media_types() {
        assert_eq!(sha256(b"{}"), "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a");
        assert_eq!(media_type("instances/a.lcov"), "text/x-lcov");
        assert_eq!(media_type("manifest.json"), "application/json");
        assert_eq!(media_type("coverage.xml"), "application/xml");
        assert_eq!(media_type("instances/a.profraw"), "application/octet-stream");
    }
}
