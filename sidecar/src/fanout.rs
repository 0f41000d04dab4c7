//! Asking many targets at once: bounded parallelism, a timeout per request
//! and one retry, every answer checked (a `Livecov-Instance` header, LCOV
//! that parses) and bounded in size. Used by the sidecar and by
//! `livecov collect`.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use hyper::body::Bytes;
use tokio::sync::Semaphore;

use livecov::fleet::{self, BuildMapping};

use crate::client::{Client, ClientError, CoverageQuery};
use crate::snapshot::{check_lcov, excerpt, Meta};
use crate::targets::Endpoint;

/// How to ask.
#[derive(Debug, Clone)]
pub struct FetchOptions {
    /// Sent as `Authorization: Bearer` to TCP targets.
    pub token: Option<String>,
    /// Bounds each request (connecting included).
    pub timeout: Duration,
    /// The largest answer accepted, in bytes.
    pub max_body: usize,
    /// Targets asked at once.
    pub parallelism: usize,
    /// Extra attempts after a failure that may pass (1: one retry).
    pub retries: u32,
    /// Set for an exact merge: LLVM agents are asked for their counters
    /// (and, once per build, for its mapping, kept here) rather than LCOV.
    pub mappings: Option<Arc<Mappings>>,
}

/// The build mappings fetched so far, by id (`Livecov-Mapping`): each is
/// fetched once, by the first target of its build that needs it, while the
/// others of that build wait for it.
#[derive(Default)]
pub struct Mappings {
    cells: std::sync::Mutex<std::collections::HashMap<String, Arc<tokio::sync::OnceCell<Known>>>>,
}

/// A build mapping, decoded, and its document as the agent sent it
/// (compressed), which a sidecar serves on to an aggregator.
#[derive(Clone)]
struct Known {
    mapping: Arc<BuildMapping>,
    document: Bytes,
}

impl std::fmt::Debug for Mappings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.cells.lock().map_or(0, |c| c.len());
        write!(f, "Mappings({n})")
    }
}

impl Mappings {
    /// The build mapping `id`, if a target of that build gave it already.
    pub fn known(&self, id: &str) -> Option<Arc<BuildMapping>> {
        let cells = self.cells.lock().unwrap_or_else(|e| e.into_inner());
        cells.get(id).and_then(|c| c.get().map(|k| k.mapping.clone()))
    }

    /// The document (gzip) of the build mapping `id`, as it was fetched.
    pub fn document(&self, id: &str) -> Option<Bytes> {
        let cells = self.cells.lock().unwrap_or_else(|e| e.into_inner());
        cells.get(id).and_then(|c| c.get().map(|k| k.document.clone()))
    }

    /// Keeps build mapping `id` from its `document` (gzip), read from its
    /// file in a coverage folder (see `livecov::fleet::mapping_file_name`).
    pub fn add(&self, id: &str, document: Bytes, max_body: usize) -> Result<Arc<BuildMapping>, String> {
        let known = decode(id, document, max_body)?;
        let mapping = known.mapping.clone();
        // Another thread may have kept it meanwhile: the same document.
        let _ = self.cell(id).set(known);
        Ok(mapping)
    }

    fn cell(&self, id: &str) -> Arc<tokio::sync::OnceCell<Known>> {
        let mut cells = self.cells.lock().unwrap_or_else(|e| e.into_inner());
        cells.entry(id.to_owned()).or_default().clone()
    }
}

/// What to ask each target.
#[derive(Debug, Clone)]
pub enum Ask {
    /// `GET /coverage?...` (LCOV).
    Coverage(CoverageQuery),
    /// `POST /reset`.
    Reset,
}

impl Ask {
    fn resets(&self) -> bool {
        match self {
            Ask::Coverage(q) => q.reset,
            Ask::Reset => true,
        }
    }
}

/// How one target answered.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// LCOV from `instance`.
    Snapshot { instance: String, body: Bytes, meta: Option<Meta> },
    /// The counters of `instance` (gzip, checked against its build's
    /// mapping), for an exact merge.
    Counters { instance: String, counters: Bytes, mapping: Arc<BuildMapping>, meta: Option<Meta> },
    /// `POST /reset` done.
    Reset { instance: Option<String> },
    /// A socket of a `--dir` that nobody listens on any more: its process
    /// exited or was killed (its report, if any, counts instead).
    Gone(String),
    Failed(String),
}

/// One target's answer and how long it took.
#[derive(Debug, Clone)]
pub struct Fetched {
    pub endpoint: Endpoint,
    pub started: SystemTime,
    pub duration: Duration,
    /// Of that, the target's own time to make its answer, when it says.
    pub report_time: Option<Duration>,
    pub attempts: u32,
    pub outcome: Outcome,
}

/// A target's own time to make its answer ([`Fetched::report_time`]), in
/// milliseconds to the microsecond, for the manifest and `/targets`.
pub fn report_ms(report_time: Option<Duration>) -> Option<f64> {
    report_time.map(|d| (d.as_secs_f64() * 1e6).round() / 1e3)
}

impl Fetched {
    pub fn error(&self) -> Option<&str> {
        match &self.outcome {
            Outcome::Failed(e) => Some(e),
            _ => None,
        }
    }
}

/// Decides whether the metadata (`GET /health`) of an instance is wanted.
pub type WantMeta = Arc<dyn Fn(&str) -> bool + Send + Sync>;
/// Called as each target's answer arrives.
pub type Progress = Arc<dyn Fn(&Fetched) + Send + Sync>;

/// Asks every endpoint; the answers come back in the endpoints' order.
/// `own_instance`: a target answering with this instance is the asker itself.
pub async fn fetch_all(
    endpoints: &[Endpoint],
    ask: &Ask,
    options: &FetchOptions,
    own_instance: Option<&str>,
    want_meta: WantMeta,
    progress: Option<Progress>,
) -> Vec<Fetched> {
    let permits = Arc::new(Semaphore::new(options.parallelism.max(1)));
    let mut tasks = tokio::task::JoinSet::new();
    for (i, endpoint) in endpoints.iter().enumerate() {
        let (permits, endpoint, ask, options) = (permits.clone(), endpoint.clone(), ask.clone(), options.clone());
        let own = own_instance.map(str::to_owned);
        let (want_meta, progress) = (want_meta.clone(), progress.clone());
        tasks.spawn(async move {
            let _permit = permits.acquire_owned().await;
            let fetched = fetch_one(endpoint, &ask, &options, own.as_deref(), &want_meta).await;
            if let Some(p) = &progress {
                p(&fetched);
            }
            (i, fetched)
        });
    }
    let mut out: Vec<Option<Fetched>> = vec![None; endpoints.len()];
    while let Some(joined) = tasks.join_next().await {
        // A panic in a task (a bug): its target is reported failed below.
        if let Ok((i, f)) = joined {
            out[i] = Some(f);
        }
    }
    out.into_iter()
        .zip(endpoints)
        .map(|(f, e)| {
            f.unwrap_or_else(|| Fetched {
                endpoint: e.clone(),
                started: SystemTime::now(),
                duration: Duration::ZERO,
                report_time: None,
                attempts: 1,
                outcome: Outcome::Failed("internal error while asking this target".into()),
            })
        })
        .collect()
}

async fn fetch_one(endpoint: Endpoint, ask: &Ask, options: &FetchOptions, own: Option<&str>, want_meta: &WantMeta) -> Fetched {
    let started = SystemTime::now();
    let clock = Instant::now();
    let client = Client::new(endpoint.target.clone())
        .token(options.token.clone())
        .timeout(options.timeout)
        .max_body(options.max_body);
    let mut attempts = 0;
    let mut report_time = None;
    let outcome = loop {
        attempts += 1;
        let result = match ask {
            Ask::Coverage(q) => match &options.mappings {
                Some(mappings) if q.format.is_none() => counters_or_lcov(&client, q).await.map(|r| match r {
                    Ok(counters) => Answer::Counters(counters, mappings.clone()),
                    Err(lcov) => Answer::Coverage(lcov),
                }),
                _ => client.coverage(q).await.map(Answer::Coverage),
            },
            Ask::Reset => client.reset().await.map(Answer::Reset),
        };
        match result {
            Ok(Answer::Counters(response, mappings)) => {
                report_time = response.report_time();
                break exact_snapshot(&client, response, &mappings, options.max_body, own, want_meta).await;
            }
            Ok(Answer::Coverage(response)) => {
                report_time = response.report_time();
                break snapshot(&client, response, own, want_meta).await;
            }
            Ok(Answer::Reset(instance)) => break Outcome::Reset { instance },
            Err(e) => {
                if endpoint.from_dir && matches!(e, ClientError::NoSocket { .. } | ClientError::Refused { .. }) {
                    break Outcome::Gone(e.to_string());
                }
                if attempts <= options.retries && retryable(&e, ask.resets()) {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
                break Outcome::Failed(e.to_string());
            }
        }
    };
    Fetched { endpoint, started, duration: clock.elapsed(), report_time, attempts, outcome }
}

enum Answer {
    Coverage(crate::client::Response),
    Counters(crate::client::Response, Arc<Mappings>),
    Reset(Option<String>),
}

/// Whether a failed request may be tried again. A request that resets must
/// not be repeated once the target may have acted on it (a dump-and-reset
/// whose answer was lost would lose its counts): only failures before
/// anything was sent are retried then.
fn retryable(e: &ClientError, resets: bool) -> bool {
    match e {
        ClientError::NoSocket { .. } | ClientError::Refused { .. } | ClientError::Connect { .. } => true,
        // The agent's connection limit answers before reading the request.
        ClientError::Status { status, .. } if status.as_u16() == 503 => !resets,
        ClientError::Timeout { .. } | ClientError::Protocol { .. } => !resets,
        ClientError::Status { status, .. } => status.is_server_error() && !resets,
        ClientError::PermissionDenied { .. } | ClientError::TooLarge { .. } | ClientError::Usage(_) => false,
    }
}

/// Asks for the counters; a target that has none to give (a hook, a
/// sidecar, an agent of a build it cannot describe) is asked for LCOV:
/// `Ok(Ok(counters))`, or `Ok(Err(lcov))`. Nothing was reset by a refused
/// request, so the LCOV request resets when asked to.
async fn counters_or_lcov(
    client: &Client,
    q: &CoverageQuery,
) -> Result<Result<crate::client::Response, crate::client::Response>, ClientError> {
    let counters = CoverageQuery { test: None, reset: q.reset, format: Some("counters".into()) };
    match client.coverage(&counters).await {
        Ok(r) if r.headers.contains_key(MAPPING_HEADER) => return Ok(Ok(r)),
        // A sidecar whose merge is not one exact group answers with it as
        // LCOV (it may have reset its targets already: never asked again).
        Ok(r) if r.content_type().is_some_and(|t| t.starts_with("text/plain")) => return Ok(Err(r)),
        Ok(_) => {}
        Err(ClientError::Status { status, .. }) if matches!(status.as_u16(), 400 | 404 | 500 | 501) => {}
        Err(e) => return Err(e),
    }
    client.coverage(q).await.map(Err)
}

use livecov::agent::server::MAPPING_HEADER;

/// The build mapping `id`: from `mappings`, else fetched from this target
/// (once for all targets of the build) and decoded.
async fn mapping_of(client: &Client, id: &str, mappings: &Mappings, max_body: usize) -> Result<Arc<BuildMapping>, String> {
    let cell = mappings.cell(id);
    let mapping = cell
        .get_or_try_init(|| async {
            let r = client.mapping(id).await.map_err(|e| e.to_string())?;
            let id = id.to_owned();
            tokio::task::spawn_blocking(move || decode(&id, r.body, max_body))
                .await
                .map_err(|_| "internal error while reading the build mapping".to_owned())?
                .map_err(|e| format!("its build mapping: {e}"))
        })
        .await?;
    Ok(mapping.mapping.clone())
}

/// A build mapping's document (gzip), decoded, checked to be `id`.
fn decode(id: &str, document: Bytes, max_body: usize) -> Result<Known, String> {
    let decoded = fleet::gunzip("build mapping", &document, max_body).and_then(|d| BuildMapping::decode(&d));
    let mapping = decoded.map_err(|e| e.to_string())?;
    if mapping.id() != id {
        return Err(format!("it is {}, not the {id} the counters named", mapping.id()));
    }
    Ok(Known { mapping: Arc::new(mapping), document })
}

async fn exact_snapshot(
    client: &Client,
    response: crate::client::Response,
    mappings: &Mappings,
    max_body: usize,
    own: Option<&str>,
    want_meta: &WantMeta,
) -> Outcome {
    let instance = match checked_instance(client, &response, own) {
        Ok(i) => i,
        Err(e) => return Outcome::Failed(e),
    };
    let id = response.headers.get(MAPPING_HEADER).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let mapping = match mapping_of(client, &id, mappings, max_body).await {
        Ok(m) => m,
        Err(e) => return Outcome::Failed(format!("{} (instance {instance}): {e}", client.target())),
    };
    // Checked now, so that a malformed answer is this target's error and
    // never the merge's.
    let (body, checked_with) = (response.body.clone(), mapping.clone());
    let checked = tokio::task::spawn_blocking(move || {
        let document = fleet::gunzip("counters", &body, max_body)?;
        checked_with.profiles(&document).map(drop)
    })
    .await;
    match checked {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Outcome::Failed(format!("{} (instance {instance}): its counters: {e}", client.target())),
        Err(_) => return Outcome::Failed("internal error while reading the answer".into()),
    }
    let meta = metadata(client, &instance, want_meta).await;
    Outcome::Counters { instance, counters: response.body, mapping, meta }
}

/// The instance that answered, checked: not missing, not malformed, not
/// the asker itself.
fn checked_instance(client: &Client, response: &crate::client::Response, own: Option<&str>) -> Result<String, String> {
    let Some(instance) = response.instance().map(str::to_owned) else {
        return Err(format!(
            "{} answered without a Livecov-Instance header, so not as a livecov agent or sidecar (it said: {:?})",
            client.target(),
            excerpt(&response.body)
        ));
    };
    if instance.is_empty() || instance.chars().any(|c| c.is_control() || c == '/') {
        return Err(format!("{} answered with an invalid instance id {instance:?}", client.target()));
    }
    if own == Some(instance.as_str()) {
        return Err(format!("{} is this sidecar itself (instance {instance}): leave it out of the targets", client.target()));
    }
    Ok(instance)
}

async fn metadata(client: &Client, instance: &str, want_meta: &WantMeta) -> Option<Meta> {
    if !want_meta(instance) {
        return None;
    }
    // Metadata is a nicety: its absence is not a failure.
    client.health().await.ok().map(|r| Meta::from_json(&r.body))
}

async fn snapshot(client: &Client, response: crate::client::Response, own: Option<&str>, want_meta: &WantMeta) -> Outcome {
    let instance = match checked_instance(client, &response, own) {
        Ok(i) => i,
        Err(e) => return Outcome::Failed(e),
    };
    let body = response.body;
    let checked = {
        let (name, body) = (format!("{} (instance {instance})", client.target()), body.clone());
        tokio::task::spawn_blocking(move || check_lcov(&name, &body)).await
    };
    match checked {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Outcome::Failed(format!("{} (instance {instance}): {e}", client.target())),
        Err(_) => return Outcome::Failed("internal error while reading the answer".into()),
    }
    let meta = metadata(client, &instance, want_meta).await;
    Outcome::Snapshot { instance, body, meta }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::StatusCode;

    #[test]
    fn resets_are_retried_only_before_anything_was_sent() {
        let timeout = ClientError::Timeout { target: "t".into(), after: Duration::from_secs(1) };
        assert!(retryable(&timeout, false));
        assert!(!retryable(&timeout, true));
        let refused = ClientError::Refused { target: "t".into(), unix: false };
        assert!(retryable(&refused, true));
        let status = |s: u16| ClientError::Status {
            target: "t".into(),
            path: "/".into(),
            status: StatusCode::from_u16(s).unwrap(),
            message: None,
            instance: None,
            token_sent: false,
        };
        assert!(!retryable(&status(401), false));
        assert!(retryable(&status(500), false));
        assert!(!retryable(&status(500), true));
        assert!(!retryable(&ClientError::TooLarge { target: "t".into(), limit: 1 }, false));
    }
}
