//! The process-wide part: the runtime the requests run on, the settings they obey, and one client per bucket or
//! host (each keeps its connection pool, so the ranged GETs of a load reuse connections).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpRequest, HttpResponse, HttpService, ReqwestConnector,
};
use object_store::path::Path as StorePath;
use object_store::{ClientOptions, ObjectStore, ObjectStoreScheme, RetryConfig};

use crate::error::RemoteError;
use crate::location::ObjectUrl;

/// Retries of a request after a transient failure, unless configured.
pub const DEFAULT_RETRIES: u32 = 8;
/// Longest time a request may take, unless configured.
pub const DEFAULT_TIMEOUT_SECS: u32 = 60;

/// How requests behave. Set once per process by the engine from its settings ([`configure`]); the defaults
/// serve a process that never configures.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Config {
    /// Retries of one ranged GET after a transient failure, each after a doubling backoff (50 ms up to 2 s).
    pub retries: u32,
    /// Longest time one request may take, from sending it to the last byte of its body.
    pub timeout: Duration,
    /// Longest time to connect.
    pub connect_timeout: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            retries: DEFAULT_RETRIES,
            timeout: Duration::from_secs(DEFAULT_TIMEOUT_SECS.into()),
            connect_timeout: Duration::from_secs(10),
        }
    }
}

static CONFIG: RwLock<Option<Config>> = RwLock::new(None);

/// Sets how requests behave from now on (clients made earlier with other timeouts are made again).
pub fn configure(config: Config) {
    *CONFIG.write().unwrap_or_else(|p| p.into_inner()) = Some(config);
}

/// The configuration in force.
pub fn config() -> Config {
    CONFIG.read().unwrap_or_else(|p| p.into_inner()).clone().unwrap_or_default()
}

/// The runtime every request runs on. Its threads only wait on sockets and copy bodies into their destinations;
/// a few serve many requests in flight.
pub(crate) fn runtime() -> Result<&'static tokio::runtime::Runtime, RemoteError> {
    static RUNTIME: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(2, 8);
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(threads)
                .thread_name("weightlift-net")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| RemoteError::Other {
            url: String::new(),
            message: format!("cannot start the network runtime: {e}"),
        })
}

/// Runs `f` on a thread of the network runtime's blocking pool: work that may wait on a disk (writing what arrived
/// into a local copy), which must not hold up the runtime's threads serving sockets. Where there is no runtime, `f`
/// runs on the calling thread.
pub fn run_blocking(f: impl FnOnce() + Send + 'static) {
    match runtime() {
        Ok(rt) => drop(rt.spawn_blocking(f)),
        Err(_) => f(),
    }
}

/// One object's client: the store it is read through, its path there, and what that store's origin said about
/// throttling.
#[derive(Clone, Debug)]
pub(crate) struct Client {
    pub store: Arc<dyn ObjectStore>,
    pub path: StorePath,
    pub throttle: Arc<Throttle>,
}

/// What one origin's server (a bucket's endpoint, an HTTP host) said about its load: how many times it answered 503
/// or 429. The engine sizes its GETs in flight by it.
#[derive(Debug, Default)]
pub struct Throttle {
    answers: AtomicU64,
}

impl Throttle {
    /// 503 and 429 answers from the origin so far, in this process.
    pub fn answers(&self) -> u64 {
        self.answers.load(Relaxed)
    }
}

tokio::task_local! {
    /// The `Retry-After` of the last answer to slow down seen by the request running in this task (see
    /// `Object::get`, which sets the scope): the client's errors do not carry the answer's headers.
    pub(crate) static RETRY_AFTER: std::cell::Cell<Option<Duration>>;
}

/// `Retry-After` in seconds (the HTTP-date form is rare from object stores and is read as no hint).
fn retry_after(headers: &http::HeaderMap) -> Option<Duration> {
    let secs: f64 = headers.get(http::header::RETRY_AFTER)?.to_str().ok()?.trim().parse().ok()?;
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs))
}

/// The HTTP client of one origin: `object_store`'s own reqwest client, made once and shared by every store of the
/// origin (one connection pool), with each answer to slow down noted on the way back (counted for the origin, its
/// `Retry-After` kept for the request's retry). `object_store` reads no `Retry-After` and keeps its status-carrying
/// errors private, so this is the one place that sees both.
#[derive(Debug)]
struct Connector {
    http: OnceLock<Result<HttpClient, String>>,
    throttle: Arc<Throttle>,
}

#[derive(Debug)]
struct Watching {
    inner: HttpClient,
    throttle: Arc<Throttle>,
}

#[async_trait::async_trait]
impl HttpService for Watching {
    async fn call(&self, req: HttpRequest) -> Result<HttpResponse, HttpError> {
        let response = self.inner.execute(req).await?;
        let status = response.status();
        if status == http::StatusCode::SERVICE_UNAVAILABLE || status == http::StatusCode::TOO_MANY_REQUESTS {
            self.throttle.answers.fetch_add(1, Relaxed);
            let wait = retry_after(response.headers());
            let _ = RETRY_AFTER.try_with(|c| c.set(wait));
        }
        Ok(response)
    }
}

/// A connector handed to a store builder (which takes it by value): the origin's, shared.
#[derive(Debug)]
struct SharedConnector(Arc<Connector>);

impl HttpConnector for SharedConnector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let inner = self
            .0
            .http
            .get_or_init(|| ReqwestConnector::default().connect(options).map_err(|e| e.to_string()))
            .clone()
            .map_err(|e| object_store::Error::Generic { store: "HTTP", source: e.into() })?;
        Ok(HttpClient::new(Watching { inner, throttle: self.0.throttle.clone() }))
    }
}

type Clients = HashMap<(String, Config, u64), (Arc<dyn ObjectStore>, Arc<Connector>)>;

/// A digest of the environment the stores' builders read (`AWS_*`, `GOOGLE_*`, `AZURE_*`, `HOME` for the AWS
/// profile files): a store is made again once it changes (a process that sets another endpoint or other keys after
/// its first load reaches them, not the endpoint its first load saw).
fn store_env() -> u64 {
    use std::hash::{Hash, Hasher};
    let mut vars: Vec<(std::ffi::OsString, std::ffi::OsString)> = std::env::vars_os()
        .filter(|(k, _)| {
            let k = k.to_string_lossy();
            ["AWS_", "GOOGLE_", "AZURE_"].iter().any(|p| k.starts_with(p)) || k == "HOME"
        })
        .collect();
    vars.sort();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    vars.hash(&mut h);
    h.finish()
}

/// The client for `url`'s bucket or host, and the object's path inside it. Stores of `s3://`, `gs://` and `az://`
/// are one per bucket; an `http(s)://` object gets a store of its own whose base is its whole URL (path and query
/// as written: a presigned URL's signature covers both) sharing its host's connection pool.
pub(crate) fn store_for(url: &ObjectUrl) -> Result<Client, RemoteError> {
    static CLIENTS: OnceLock<Mutex<Clients>> = OnceLock::new();
    let bad = |reason: String| RemoteError::BadUrl { url: url.to_string(), reason };
    let parsed = url.url();
    let (scheme, path) = ObjectStoreScheme::parse(parsed).map_err(|e| bad(e.to_string()))?;
    let path = StorePath::parse(path).map_err(|e| bad(e.to_string()))?;
    if path.as_ref().is_empty() {
        return Err(bad("the URL names a bucket or host but no object in it".into()));
    }
    let http = scheme == ObjectStoreScheme::Http;
    let origin = format!("{scheme:?} {}", &parsed[..url::Position::BeforePath]);
    let config = config();
    let env = store_env();
    let mut clients = CLIENTS.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    // One connection pool per origin, whatever the stores over it.
    let connector = clients
        .iter()
        .find(|((o, c, _), _)| *o == origin && *c == config)
        .map(|(_, (_, conn))| conn.clone())
        .unwrap_or_else(|| Arc::new(Connector { http: OnceLock::new(), throttle: Arc::default() }));
    let key = (if http { url.as_str().to_string() } else { origin }, config.clone(), env);
    let (store, path) = match clients.get(&key) {
        Some((store, _)) => (store.clone(), if http { StorePath::default() } else { path }),
        None => {
            let store = build(scheme, url, &config, connector.clone())?;
            // A process reading thousands of http objects keeps a bounded number of stores (their pool is shared).
            if http && clients.len() >= 4096 {
                clients.retain(|(k, _, _), _| !k.starts_with("http"));
            }
            // Stores of this name made under an environment that has changed since are not used again.
            clients.retain(|(k, c, e), _| !(*k == key.0 && *c == key.1 && *e != env));
            clients.insert(key, (store.clone(), connector.clone()));
            (store, if http { StorePath::default() } else { path })
        }
    };
    Ok(Client { store, path, throttle: connector.throttle.clone() })
}

fn build(
    scheme: ObjectStoreScheme,
    url: &ObjectUrl,
    config: &Config,
    connector: Arc<Connector>,
) -> Result<Arc<dyn ObjectStore>, RemoteError> {
    let connector = SharedConnector(connector);
    let bad = |e: object_store::Error| RemoteError::BadUrl { url: url.to_string(), reason: e.to_string() };
    // Retries are this crate's (see `Object`): it resumes a body cut short where it stopped, waits out the
    // server's Retry-After, and counts them for the report, which the client's own retries do not.
    let retry = RetryConfig { max_retries: 0, ..Default::default() };
    let options = ClientOptions::new()
        .with_timeout(config.timeout)
        .with_connect_timeout(config.connect_timeout)
        // Plain http is the caller's choice, made by writing http:// or an http endpoint.
        .with_allow_http(true);
    let url_text = url.url().as_str();
    Ok(match scheme {
        ObjectStoreScheme::AmazonS3 => Arc::new(
            aws_profile(object_store::aws::AmazonS3Builder::from_env())
                .map_err(|message| RemoteError::Credentials { url: url.to_string(), message })?
                .with_url(url_text)
                .with_retry(retry)
                .with_client_options(options)
                .with_http_connector(connector)
                .build()
                .map_err(bad)?,
        ),
        ObjectStoreScheme::GoogleCloudStorage => Arc::new(
            object_store::gcp::GoogleCloudStorageBuilder::from_env()
                .with_url(url_text)
                .with_retry(retry)
                .with_client_options(options)
                .with_http_connector(connector)
                .build()
                .map_err(bad)?,
        ),
        ObjectStoreScheme::MicrosoftAzure => Arc::new(
            object_store::azure::MicrosoftAzureBuilder::from_env()
                .with_url(url_text)
                .with_retry(retry)
                .with_client_options(options)
                .with_http_connector(connector)
                .build()
                .map_err(bad)?,
        ),
        ObjectStoreScheme::Http => Arc::new(
            object_store::http::HttpBuilder::new()
                .with_url(url_text)
                .with_retry(retry)
                .with_client_options(options)
                .with_http_connector(connector)
                .build()
                .map_err(bad)?,
        ),
        other => {
            return Err(RemoteError::BadUrl {
                url: url.to_string(),
                reason: format!("{other:?} URLs are read as local paths, not objects"),
            });
        }
    })
}

/// How an AWS profile can get credentials that `object_store`'s chain cannot follow. A profile that asks for one is
/// refused with what to do instead: ignored, the chain would sign with other credentials, or none.
const PROFILE_WAYS: [(&str, &str); 6] = [
    ("role_arn", "assumes a role (role_arn)"),
    ("source_profile", "assumes a role (source_profile)"),
    ("credential_process", "runs a credential process (credential_process)"),
    ("sso_session", "signs in through IAM Identity Center (sso_session)"),
    ("sso_start_url", "signs in through IAM Identity Center (sso_start_url)"),
    ("web_identity_token_file", "uses a web identity token from its profile (web_identity_token_file)"),
];

/// Credentials and region from the AWS profile files, where the environment sets none: `object_store` reads the
/// environment, web identity (`AWS_WEB_IDENTITY_TOKEN_FILE` with `AWS_ROLE_ARN`: IRSA), container and instance
/// credentials, but not `~/.aws`, where users of the AWS CLI keep keys.
pub(crate) fn aws_profile(
    mut builder: object_store::aws::AmazonS3Builder,
) -> Result<object_store::aws::AmazonS3Builder, String> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    for (key, value) in profile_config(&env)? {
        builder = builder.with_config(key, value);
    }
    Ok(builder)
}

/// What the AWS profile files give where the environment (`env`) does not: static keys, region and endpoint of
/// the profile (`AWS_PROFILE`, else `default`; `[NAME]` in `credentials`, `[profile NAME]` in `config`). A
/// profile that gets its credentials another way (roles, SSO, a process) is refused with what to do instead, and
/// so is an `AWS_PROFILE` that names no profile.
fn profile_config(
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<(object_store::aws::AmazonS3ConfigKey, String)>, String> {
    use object_store::aws::AmazonS3ConfigKey as K;
    let named = env("AWS_PROFILE");
    let profile = named.clone().unwrap_or_else(|| "default".into());
    let home = env("HOME").unwrap_or_default();
    let credentials = env("AWS_SHARED_CREDENTIALS_FILE").unwrap_or_else(|| format!("{home}/.aws/credentials"));
    let config = env("AWS_CONFIG_FILE").unwrap_or_else(|| format!("{home}/.aws/config"));
    let from_credentials = ini_section(&credentials, &profile);
    let config_section = if profile == "default" { profile.clone() } else { format!("profile {profile}") };
    let from_config = ini_section(&config, &config_section);
    if named.is_some() && from_credentials.is_none() && from_config.is_none() {
        return Err(format!("AWS_PROFILE={profile}: no such profile in {credentials} or {config}"));
    }
    let (from_credentials, from_config) = (from_credentials.unwrap_or_default(), from_config.unwrap_or_default());
    let get = |k: &str| from_credentials.get(k).or_else(|| from_config.get(k)).cloned();
    let mut out = Vec::new();
    // Credentials from the environment come first, as in the AWS SDKs: the profile's are not looked at then.
    let from_env = env("AWS_ACCESS_KEY_ID").is_some()
        || (env("AWS_WEB_IDENTITY_TOKEN_FILE").is_some() && env("AWS_ROLE_ARN").is_some())
        || env("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI").is_some()
        || env("AWS_CONTAINER_CREDENTIALS_FULL_URI").is_some();
    if !from_env {
        if let Some((_, how)) = PROFILE_WAYS.iter().find(|(key, _)| get(key).is_some()) {
            return Err(format!(
                "AWS profile '{profile}' {how}, which weightlift's S3 client (object_store) cannot follow; export \
                 its credentials first (eval \"$(aws configure export-credentials --profile {profile} --format env)\"), \
                 or use keys, web identity (AWS_WEB_IDENTITY_TOKEN_FILE with AWS_ROLE_ARN), container or instance \
                 credentials"
            ));
        }
        if let (Some(id), Some(secret)) = (get("aws_access_key_id"), get("aws_secret_access_key")) {
            out.push((K::AccessKeyId, id));
            out.push((K::SecretAccessKey, secret));
            if let Some(token) = get("aws_session_token") {
                out.push((K::Token, token));
            }
        }
    }
    if env("AWS_REGION").or_else(|| env("AWS_DEFAULT_REGION")).is_none()
        && let Some(region) = get("region")
    {
        out.push((K::Region, region));
    }
    if env("AWS_ENDPOINT_URL").or_else(|| env("AWS_ENDPOINT")).or_else(|| env("AWS_ENDPOINT_URL_S3")).is_none()
        && let Some(endpoint) = get("endpoint_url")
    {
        out.push((K::Endpoint, endpoint));
    }
    Ok(out)
}

/// The `key = value` lines of section `[name]` of an INI file (`None` when the file or the section is missing).
fn ini_section(path: &str, name: &str) -> Option<HashMap<String, String>> {
    parse_ini_section(&std::fs::read_to_string(path).ok()?, name)
}

fn parse_ini_section(text: &str, name: &str) -> Option<HashMap<String, String>> {
    let mut out = None;
    let mut inside = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('#') || line.starts_with(';') || line.is_empty() {
            continue;
        }
        if let Some(section) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = section.trim() == name;
            if inside {
                out.get_or_insert_with(HashMap::new);
            }
            continue;
        }
        if inside && let Some((k, v)) = line.split_once('=') {
            out.get_or_insert_with(HashMap::new).insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_sections_are_read_alone() {
        let text = "[default]\naws_access_key_id = A\n# c\n[profile other]\nregion=eu-west-1\n[other]\nx = 1\n";
        let d = parse_ini_section(text, "default").unwrap();
        assert_eq!(d.get("aws_access_key_id").map(String::as_str), Some("A"));
        assert_eq!(d.len(), 1);
        let p = parse_ini_section(text, "profile other").unwrap();
        assert_eq!(p.get("region").map(String::as_str), Some("eu-west-1"));
        assert!(parse_ini_section(text, "missing").is_none());
        assert!(parse_ini_section("[empty]\n", "empty").is_some_and(|s| s.is_empty()));
    }

    /// Work handed to `run_blocking` from the runtime's threads (as a read's completion hands a local copy's write)
    /// waits without holding them: more of it than the runtime has threads waits at once, and async work still runs.
    #[test]
    fn blocking_work_leaves_the_runtime_threads_free() {
        use std::sync::mpsc::channel;
        let rt = runtime().unwrap();
        let waiting = 16; // more than the runtime's threads (at most 8)
        let (release, released) = channel::<()>();
        let released = Arc::new(Mutex::new(released));
        let (started, starts) = channel();
        for _ in 0..waiting {
            let (released, started) = (released.clone(), started.clone());
            rt.spawn(async move {
                run_blocking(move || {
                    let _ = started.send(());
                    let _ = released.lock().unwrap_or_else(|p| p.into_inner()).recv();
                })
            });
        }
        for i in 0..waiting {
            starts.recv_timeout(Duration::from_secs(10)).unwrap_or_else(|_| panic!("{i} of {waiting} started"));
        }
        let (done, finished) = channel();
        rt.spawn(async move {
            tokio::time::sleep(Duration::from_millis(1)).await;
            let _ = done.send(());
        });
        finished.recv_timeout(Duration::from_secs(10)).expect("async work ran while the blocking work waited");
        drop(release);
    }

    /// Profiles in files of a temporary folder, read with a made-up environment (the process's is left alone).
    fn profiles(credentials: &str, config: &str, vars: &[(&str, &str)]) -> Result<Vec<String>, String> {
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!("wl-aws-{}-{}", std::process::id(), N.fetch_add(1, Relaxed)));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("credentials"), credentials).unwrap();
        std::fs::write(dir.join("config"), config).unwrap();
        let files = [
            ("AWS_SHARED_CREDENTIALS_FILE", dir.join("credentials").display().to_string()),
            ("AWS_CONFIG_FILE", dir.join("config").display().to_string()),
        ];
        let env = |k: &str| {
            files
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.clone())
                .or_else(|| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string()))
        };
        let got = profile_config(&env);
        let _ = std::fs::remove_dir_all(&dir);
        got.map(|kv| kv.into_iter().map(|(k, v)| format!("{k:?}={v}")).collect())
    }

    #[test]
    fn profiles_give_keys_region_and_endpoint() {
        let creds = "[default]\naws_access_key_id = AK\naws_secret_access_key = SK\n";
        let config = "[default]\nregion = eu-west-3\nendpoint_url = http://minio:9000\n";
        let got = profiles(creds, config, &[]).unwrap();
        assert_eq!(got.len(), 4, "{got:?}");
        assert!(got.iter().any(|s| s.ends_with("=AK")) && got.iter().any(|s| s.ends_with("=eu-west-3")), "{got:?}");
        // Keys in the environment win: the profile's are not taken.
        let got = profiles(creds, config, &[("AWS_ACCESS_KEY_ID", "ENV"), ("AWS_REGION", "us-east-2")]).unwrap();
        assert_eq!(got.len(), 1, "only the endpoint: {got:?}");
    }

    #[test]
    fn profiles_weightlift_cannot_follow_are_refused_with_what_to_do() {
        for (config, how) in [
            ("[profile dev]\nrole_arn = arn:aws:iam::1:role/r\nsource_profile = default\n", "assumes a role"),
            ("[profile dev]\nsso_session = corp\nsso_account_id = 1\n", "IAM Identity Center"),
            ("[profile dev]\ncredential_process = /bin/creds\n", "credential process"),
            ("[profile dev]\nweb_identity_token_file = /t\nrole_arn = r\n", "assumes a role"),
        ] {
            let err = profiles("", config, &[("AWS_PROFILE", "dev")]).unwrap_err();
            assert!(err.contains("AWS profile 'dev'") && err.contains(how), "{err}");
            assert!(err.contains("export-credentials --profile dev"), "{err}");
        }
        let err = profiles("", "", &[("AWS_PROFILE", "nope")]).unwrap_err();
        assert!(err.starts_with("AWS_PROFILE=nope: no such profile"), "{err}");
        // Web identity from the environment (IRSA) is object_store's own: the profile is not consulted.
        let irsa = [("AWS_PROFILE", "dev"), ("AWS_WEB_IDENTITY_TOKEN_FILE", "/t"), ("AWS_ROLE_ARN", "arn")];
        assert!(profiles("", "[profile dev]\nrole_arn = r\n", &irsa).is_ok());
    }

    #[test]
    fn a_bucket_without_an_object_is_refused() {
        let err = store_for(&ObjectUrl::parse("s3://bucket/").unwrap()).expect_err("no object named");
        assert!(err.to_string().contains("no object"), "{err}");
    }
}
