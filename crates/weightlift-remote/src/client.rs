//! The process-wide part: the runtime the requests run on, the settings they obey, and one client per bucket or
//! host (each keeps its connection pool, so the ranged GETs of a load reuse connections).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use object_store::path::Path as StorePath;
use object_store::{ClientOptions, ObjectStore, ObjectStoreScheme, RetryConfig};
use url::Url;

use crate::error::RemoteError;

/// URL schemes read as objects. `file://` is not among them: local paths go to the file engine.
const SCHEMES: [&str; 9] = ["s3", "s3a", "gs", "az", "abfs", "abfss", "azure", "http", "https"];

/// Whether `location` names an object to fetch rather than a local path.
pub fn is_url(location: &str) -> bool {
    location
        .split_once("://")
        .is_some_and(|(scheme, rest)| !rest.is_empty() && SCHEMES.iter().any(|s| s.eq_ignore_ascii_case(scheme)))
}

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

type Clients = HashMap<(String, Config), Arc<dyn ObjectStore>>;

/// The client for `url`'s bucket or host, and the object's path inside it.
pub(crate) fn store_for(url: &str) -> Result<(Arc<dyn ObjectStore>, StorePath), RemoteError> {
    static CLIENTS: OnceLock<Mutex<Clients>> = OnceLock::new();
    let bad = |reason: String| RemoteError::BadUrl { url: url.to_string(), reason };
    let parsed = Url::parse(url).map_err(|e| bad(e.to_string()))?;
    let (scheme, path) = ObjectStoreScheme::parse(&parsed).map_err(|e| bad(e.to_string()))?;
    let path = StorePath::parse(path).map_err(|e| bad(e.to_string()))?;
    if path.as_ref().is_empty() {
        return Err(bad("the URL names a bucket or host but no object in it".into()));
    }
    let config = config();
    let key = (format!("{scheme:?} {}", &parsed[..url::Position::BeforePath]), config.clone());
    let mut clients = CLIENTS.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    if let Some(store) = clients.get(&key) {
        return Ok((store.clone(), path));
    }
    let store = build(scheme, &parsed, &config).map_err(|e| bad(e.to_string()))?;
    clients.insert(key, store.clone());
    Ok((store, path))
}

fn build(scheme: ObjectStoreScheme, url: &Url, config: &Config) -> object_store::Result<Arc<dyn ObjectStore>> {
    // Retries are this crate's (see `Object`): it resumes a body cut short where it stopped and counts them for
    // the report, which the client's own retries do not tell.
    let retry = RetryConfig { max_retries: 0, ..Default::default() };
    let options = ClientOptions::new()
        .with_timeout(config.timeout)
        .with_connect_timeout(config.connect_timeout)
        // Plain http is the caller's choice, made by writing http:// or an http endpoint.
        .with_allow_http(true);
    let url_text = url.as_str();
    Ok(match scheme {
        ObjectStoreScheme::AmazonS3 => Arc::new(
            crate::client::aws_profile(object_store::aws::AmazonS3Builder::from_env())
                .with_url(url_text)
                .with_retry(retry)
                .with_client_options(options)
                .build()?,
        ),
        ObjectStoreScheme::GoogleCloudStorage => Arc::new(
            object_store::gcp::GoogleCloudStorageBuilder::from_env()
                .with_url(url_text)
                .with_retry(retry)
                .with_client_options(options)
                .build()?,
        ),
        ObjectStoreScheme::MicrosoftAzure => Arc::new(
            object_store::azure::MicrosoftAzureBuilder::from_env()
                .with_url(url_text)
                .with_retry(retry)
                .with_client_options(options)
                .build()?,
        ),
        ObjectStoreScheme::Http => Arc::new(
            object_store::http::HttpBuilder::new()
                .with_url(&url[..url::Position::BeforePath])
                .with_retry(retry)
                .with_client_options(options)
                .build()?,
        ),
        other => {
            return Err(object_store::Error::NotSupported {
                source: format!("{other:?} URLs are read as local paths, not objects").into(),
            });
        }
    })
}

/// Credentials and region from the AWS profile files, where the environment sets none: `object_store` reads only
/// the environment (and instance metadata), while users of the AWS CLI keep keys in `~/.aws/credentials`. The
/// files are INI with `[profile]` sections (`[profile NAME]` in `config`); only the keys below are read.
pub(crate) fn aws_profile(mut builder: object_store::aws::AmazonS3Builder) -> object_store::aws::AmazonS3Builder {
    use object_store::aws::AmazonS3ConfigKey as K;
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let profile = env("AWS_PROFILE").unwrap_or_else(|| "default".into());
    let home = env("HOME").unwrap_or_default();
    let credentials = env("AWS_SHARED_CREDENTIALS_FILE").unwrap_or_else(|| format!("{home}/.aws/credentials"));
    let config = env("AWS_CONFIG_FILE").unwrap_or_else(|| format!("{home}/.aws/config"));
    let from_credentials = ini_section(&credentials, &profile);
    let config_section = if profile == "default" { profile.clone() } else { format!("profile {profile}") };
    let from_config = ini_section(&config, &config_section);
    let keys_in_env = env("AWS_ACCESS_KEY_ID").is_some();
    let get = |k: &str| from_credentials.get(k).or_else(|| from_config.get(k)).cloned();
    if !keys_in_env && let (Some(id), Some(secret)) = (get("aws_access_key_id"), get("aws_secret_access_key")) {
        builder = builder.with_config(K::AccessKeyId, id).with_config(K::SecretAccessKey, secret);
        if let Some(token) = get("aws_session_token") {
            builder = builder.with_config(K::Token, token);
        }
    }
    if env("AWS_REGION").or_else(|| env("AWS_DEFAULT_REGION")).is_none()
        && let Some(region) = get("region")
    {
        builder = builder.with_config(K::Region, region);
    }
    if env("AWS_ENDPOINT_URL").or_else(|| env("AWS_ENDPOINT")).or_else(|| env("AWS_ENDPOINT_URL_S3")).is_none()
        && let Some(endpoint) = get("endpoint_url")
    {
        builder = builder.with_config(K::Endpoint, endpoint);
    }
    builder
}

/// The `key = value` lines of section `[name]` of an INI file (empty when the file or section is missing).
fn ini_section(path: &str, name: &str) -> HashMap<String, String> {
    let Ok(text) = std::fs::read_to_string(path) else { return HashMap::new() };
    parse_ini_section(&text, name)
}

fn parse_ini_section(text: &str, name: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let mut inside = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('#') || line.starts_with(';') || line.is_empty() {
            continue;
        }
        if let Some(section) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = section.trim() == name;
            continue;
        }
        if inside && let Some((k, v)) = line.split_once('=') {
            out.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_paths_are_told_apart() {
        for url in ["s3://b/k", "S3://b/k.safetensors", "gs://b/x", "az://c/x", "http://127.0.0.1:9/a", "https://h/a"] {
            assert!(is_url(url), "{url}");
        }
        for path in ["/tmp/a", "a.safetensors", "file:///tmp/a", "s3:/b/k", "s3://", "ftp://h/a", "C://x"] {
            assert!(!is_url(path), "{path}");
        }
    }

    #[test]
    fn profile_sections_are_read_alone() {
        let text = "[default]\naws_access_key_id = A\n# c\n[profile other]\nregion=eu-west-1\n[other]\nx = 1\n";
        let d = parse_ini_section(text, "default");
        assert_eq!(d.get("aws_access_key_id").map(String::as_str), Some("A"));
        assert_eq!(d.len(), 1);
        let p = parse_ini_section(text, "profile other");
        assert_eq!(p.get("region").map(String::as_str), Some("eu-west-1"));
        assert!(parse_ini_section(text, "missing").is_empty());
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

    #[test]
    fn a_bucket_without_an_object_is_refused() {
        let err = store_for("s3://bucket/").expect_err("no object named");
        assert!(err.to_string().contains("no object"), "{err}");
    }
}
