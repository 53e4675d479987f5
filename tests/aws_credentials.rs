//! The AWS credential chain, one test per source, each proven by objects that land in moto
//! (signature checks on: it refuses anything not signed with credentials it issued) signed
//! with the credentials the source handed out.
//!
//! - `AssumeRole`: moto's own STS, signed with the source profile's keys.
//! - `AssumeRoleWithWebIdentity`, the container endpoint, IMDSv2: local fakes strict to AWS's
//!   documentation (every request checked; a violation fails the test) that hand out
//!   temporary credentials moto's STS issued. The first answer expires within seconds: the
//!   test sees the second fetch and writes again with the new credentials.
//! - `credential_process`: a helper script run without a shell.
//!
//! `svc test-sink` and `svc run` name the source that answered in their output, never a key.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::support::http::read_request;
use crate::support::moto::Moto;
use crate::support::TempDir;
use serde_json::json;
use svc::config::RuntimeConfig;
use svc::metrics::Metrics;
use svc::sink::object_store::config::ObjectStoreConfig;
use svc::sink::object_store::ObjectStoreSink;
use svc::sink::SinkConfig;

type Creds = (String, String, String);

/// One moto for the binary and a pool of temporary credentials its STS issued (one helper
/// call: each costs a Python start).
fn store() -> &'static (Moto, Mutex<Vec<Creds>>) {
    static STORE: OnceLock<(Moto, Mutex<Vec<Creds>>)> = OnceLock::new();
    STORE.get_or_init(|| {
        let m = Moto::start();
        let pool = m.temporary_credentials(12);
        (m, Mutex::new(pool))
    })
}

fn take(n: usize) -> Vec<Creds> {
    let mut pool = store().1.lock().unwrap();
    let at = pool.len() - n;
    pool.split_off(at)
}

fn sink(bucket: &str, env: &HashMap<String, String>) -> Result<ObjectStoreSink, String> {
    let m = &store().0;
    m.create_bucket(bucket, false);
    let doc = json!({
        "nats": {"url": "nats://127.0.0.1:4222", "stream": "S", "consumer": "c", "subject": "a.>"},
        "sink": {"type": "object_store", "bucket": bucket, "endpoint_url": m.endpoint(),
                 "allow_http_for_local_testing": true, "request_timeout_seconds": 10},
    });
    let cfg: ObjectStoreConfig = match RuntimeConfig::parse(&doc.to_string()).unwrap().sink {
        SinkConfig::ObjectStore(c) => *c,
        other => panic!("{other:?}"),
    };
    ObjectStoreSink::with_env(cfg, Arc::new(Metrics::default()), env).map_err(|e| e.to_string())
}

fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Puts `key` with the sink's current credentials and checks which access key signed it.
fn put(s: &ObjectStoreSink, key: &str, signed_by: &str) {
    let current = s.client().credentials().current().unwrap();
    assert_eq!(
        current.access_key_id, signed_by,
        "credentials in use for {key}"
    );
    let status = s
        .client()
        .put_object(key, b"{}", &[])
        .unwrap_or_else(|e| panic!("put {key}: {e}"));
    assert_eq!(status, 200);
}

/// The keys stored in `bucket`, read back with the IAM user's keys.
fn stored(bucket: &str) -> Vec<String> {
    let mut keys: Vec<String> = store().0.versions(bucket).into_keys().collect();
    keys.sort();
    keys
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(90);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(25));
    }
}

fn rfc3339_in(secs: u64) -> String {
    (time::OffsetDateTime::now_utc() + Duration::from_secs(secs))
        .replace_nanosecond(0)
        .unwrap()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap()
}

/// Lifetime of the n-th answer of a fake: the first expires soon (refresh), later ones last.
fn lifetime(n: usize) -> u64 {
    if n == 0 {
        6
    } else {
        3600
    }
}

/// The access key id boto3's own default chain gets with `env` (and nothing else): a check
/// that a fake endpoint answers what AWS's SDKs ask and expect. Empty when it found none.
fn boto3_access_key(env: &HashMap<String, String>) -> String {
    let home = TempDir::new("boto3-home");
    let out = std::process::Command::new(crate::support::python::python())
        .args([
            "-c",
            "import boto3\nc = boto3.Session().get_credentials()\n\
             print(c.get_frozen_credentials().access_key if c else '')",
        ])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap())
        .env("HOME", home.path())
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .envs(env)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "boto3: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

// ---- a strict fake HTTP endpoint ----

struct Req {
    method: String,
    path: String,
    /// Lower-cased names.
    headers: BTreeMap<String, String>,
    body: Vec<u8>,
}

/// `Ok((status, content type, body))`, or `Err(violation)` (answered 400 and recorded).
type Handler = Arc<dyn Fn(&Req) -> Result<(u16, &'static str, String), String> + Send + Sync>;

struct Fake {
    port: u16,
    violations: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
}

impl Fake {
    fn start(handler: Handler) -> Fake {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let violations = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (v, st) = (violations.clone(), stop.clone());
        std::thread::Builder::new()
            .name("fake-aws-accept".into())
            .spawn(move || {
                while !st.load(Ordering::SeqCst) {
                    match listener.accept() {
                        Ok((conn, _)) => {
                            let (h, v) = (handler.clone(), v.clone());
                            std::thread::Builder::new()
                                .name("fake-aws-conn".into())
                                .spawn(move || serve(conn, &h, &v))
                                .unwrap();
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            })
            .unwrap();
        Fake {
            port,
            violations,
            stop,
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn assert_strict(&self) {
        let v = self.violations.lock().unwrap();
        assert!(v.is_empty(), "requests against the documentation: {v:?}");
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn serve(mut conn: TcpStream, handler: &Handler, violations: &Mutex<Vec<String>>) {
    conn.set_nonblocking(false).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let r = match read_request(&mut conn) {
        Ok(r) => r,
        Err(e) => {
            violations
                .lock()
                .unwrap()
                .push(format!("malformed request: {e}"));
            return;
        }
    };
    let req = Req {
        method: r.method,
        path: r.target,
        headers: r.headers.into_iter().collect(),
        body: r.body,
    };
    let (status, ctype, text) = match handler(&req) {
        Ok(a) => a,
        Err(v) => {
            violations
                .lock()
                .unwrap()
                .push(format!("{} {}: {v}", req.method, req.path));
            (400, "text/plain", v)
        }
    };
    let _ = write!(
        conn,
        "HTTP/1.1 {status} X\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    );
}

fn form(body: &[u8]) -> BTreeMap<String, String> {
    url::form_urlencoded::parse(body).into_owned().collect()
}

fn require(cond: bool, why: &str) -> Result<(), String> {
    if cond {
        Ok(())
    } else {
        Err(why.to_string())
    }
}

// ---- the sources ----

#[test]
fn assume_role_profile_through_moto_sts_with_signature_checks() {
    let m = &store().0;
    m.create_role("svc-writer");
    let dir = TempDir::new("assume-role");
    let creds = dir.path().join("credentials");
    let config = dir.path().join("config");
    std::fs::write(
        &creds,
        format!(
            "[base]\naws_access_key_id = {id}\naws_secret_access_key = {secret}\n\
             [wrong]\naws_access_key_id = {id}\naws_secret_access_key = not-the-secret-1234\n",
            id = m.key_id,
            secret = m.secret
        ),
    )
    .unwrap();
    std::fs::write(
        &config,
        "[profile writer]\nrole_arn = arn:aws:iam::123456789012:role/svc-writer\n\
         source_profile = base\nrole_session_name = svc-role-test\nregion = us-east-1\n\
         [profile broken]\nrole_arn = arn:aws:iam::123456789012:role/svc-writer\n\
         source_profile = wrong\n",
    )
    .unwrap();
    let mut e = env(&[
        ("AWS_SHARED_CREDENTIALS_FILE", creds.to_str().unwrap()),
        ("AWS_CONFIG_FILE", config.to_str().unwrap()),
        ("AWS_PROFILE", "writer"),
        ("AWS_ENDPOINT_URL", &m.endpoint()),
    ]);
    let s = sink("creds-assume-role", &e).unwrap();
    let provider = s.client().credentials();
    assert_eq!(
        provider.source().to_string(),
        "profile writer: role arn:aws:iam::123456789012:role/svc-writer via STS AssumeRole \
         with the credentials of profile base"
    );
    let temp = provider.current().unwrap();
    assert_ne!(
        temp.access_key_id, m.key_id,
        "the role's, not the base keys"
    );
    assert!(temp.session_token.is_some());
    assert!(provider.expiration().is_some());
    put(&s, "role/1", &temp.access_key_id);
    assert_eq!(stored("creds-assume-role"), ["role/1"]);

    // moto's STS checks the signature: a wrong source secret is refused, and said so
    // without the secret.
    e.insert("AWS_PROFILE".into(), "broken".into());
    let err = sink("creds-assume-role", &e).err().unwrap();
    assert!(err.contains("STS AssumeRole at http://127.0.0.1:"), "{err}");
    assert!(err.contains("(AWS_ENDPOINT_URL): HTTP 403: "), "{err}");
    assert!(!err.contains("not-the-secret-1234"), "{err}");

    // And the store refuses a temporary key with another secret: signatures are checked.
    let (id, _, token) = &take(1)[0];
    let wrong = env(&[
        ("AWS_ACCESS_KEY_ID", id),
        ("AWS_SECRET_ACCESS_KEY", "wrong-secret-for-this-key"),
        ("AWS_SESSION_TOKEN", token),
    ]);
    let s = sink("creds-assume-role", &wrong).unwrap();
    let e = s.client().put_object("role/2", b"{}", &[]).unwrap_err();
    assert!(e.to_string().starts_with("status 403"), "{e}");
}

#[test]
fn web_identity_through_a_strict_sts_and_refreshed_before_expiry() {
    const ROLE: &str = "arn:aws:iam::123456789012:role/svc-irsa";
    let issued = take(2);
    let dir = TempDir::new("web-identity");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "eyJhbGciOiJSUzI1NiJ9.first.sig").unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let (c, f, creds) = (calls.clone(), token_file.clone(), issued.clone());
    let fake = Fake::start(Arc::new(move |r: &Req| {
        // https://docs.aws.amazon.com/STS/latest/APIReference/API_AssumeRoleWithWebIdentity.html
        require(r.method == "POST" && r.path == "/", "not POST /")?;
        require(
            r.headers
                .get("content-type")
                .is_some_and(|t| t.starts_with("application/x-www-form-urlencoded")),
            "not a form body",
        )?;
        require(
            !r.headers.contains_key("authorization")
                && !r.headers.contains_key("x-amz-security-token"),
            "signed, but this call is unsigned by design",
        )?;
        let p = form(&r.body);
        let names: Vec<&str> = p.keys().map(String::as_str).collect();
        require(
            names
                == [
                    "Action",
                    "RoleArn",
                    "RoleSessionName",
                    "Version",
                    "WebIdentityToken",
                ],
            "parameters",
        )?;
        require(p["Action"] == "AssumeRoleWithWebIdentity", "Action")?;
        require(p["Version"] == "2011-06-15", "Version")?;
        require(p["RoleArn"] == ROLE, "RoleArn")?;
        require(p["RoleSessionName"] == "svc-irsa-test", "RoleSessionName")?;
        let token = std::fs::read_to_string(&f).unwrap();
        require(p["WebIdentityToken"] == token, "WebIdentityToken")?;
        let n = c.fetch_add(1, Ordering::SeqCst);
        let (id, secret, tok) = &creds[n.min(creds.len() - 1)];
        Ok((
            200,
            "text/xml",
            format!(
                "<AssumeRoleWithWebIdentityResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\">\
                 <AssumeRoleWithWebIdentityResult>\
                 <SubjectFromWebIdentityToken>system:serviceaccount:ns:svc</SubjectFromWebIdentityToken>\
                 <AssumedRoleUser><Arn>{ROLE}/svc-irsa-test</Arn><AssumedRoleId>AROA:svc</AssumedRoleId></AssumedRoleUser>\
                 <Credentials><SessionToken>{tok}</SessionToken><SecretAccessKey>{secret}</SecretAccessKey>\
                 <Expiration>{}</Expiration><AccessKeyId>{id}</AccessKeyId></Credentials>\
                 </AssumeRoleWithWebIdentityResult><ResponseMetadata><RequestId>r</RequestId></ResponseMetadata>\
                 </AssumeRoleWithWebIdentityResponse>",
                rfc3339_in(lifetime(n))
            ),
        ))
    }));
    let e = env(&[
        ("AWS_WEB_IDENTITY_TOKEN_FILE", token_file.to_str().unwrap()),
        ("AWS_ROLE_ARN", ROLE),
        ("AWS_ROLE_SESSION_NAME", "svc-irsa-test"),
        ("AWS_ENDPOINT_URL_STS", &fake.url()),
        ("AWS_REGION", "us-east-1"),
    ]);
    let s = sink("creds-web-identity", &e).unwrap();
    let provider = s.client().credentials();
    assert!(provider.source().to_string().starts_with("web identity"));
    put(&s, "webid/1", &issued[0].0);
    // The token rotates (as the kubelet does); the refresh reads it again.
    std::fs::write(&token_file, "eyJhbGciOiJSUzI1NiJ9.second.sig").unwrap();
    wait_until("the refresh", || provider.fetches() >= 2);
    put(&s, "webid/2", &issued[1].0);
    assert_eq!(stored("creds-web-identity"), ["webid/1", "webid/2"]);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    // boto3's chain asks the fake the same way and reads its answer.
    assert_eq!(boto3_access_key(&e), issued[1].0);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    fake.assert_strict();
}

/// The container credentials endpoint as documented: `GET` of the URI with the
/// `Authorization` header equal to the token file's content; `life(n)`: lifetime of the n-th
/// answer.
fn container_fake(
    creds: Vec<Creds>,
    token_file: std::path::PathBuf,
    calls: Arc<AtomicUsize>,
    life: fn(usize) -> u64,
) -> Fake {
    Fake::start(Arc::new(move |r: &Req| {
        // https://docs.aws.amazon.com/sdkref/latest/guide/feature-container-credentials.html
        require(
            r.method == "GET" && r.path == "/v1/credentials",
            "not GET /v1/credentials",
        )?;
        let want = std::fs::read_to_string(&token_file).unwrap();
        require(
            r.headers.get("authorization") == Some(&want),
            "Authorization is not the token file's content",
        )?;
        require(r.body.is_empty(), "a body on GET")?;
        let n = calls.fetch_add(1, Ordering::SeqCst);
        let (id, secret, tok) = &creds[n.min(creds.len() - 1)];
        Ok((
            200,
            "application/json",
            json!({"RoleArn": "arn:aws:iam::123456789012:role/svc-pod", "AccessKeyId": id,
                   "SecretAccessKey": secret, "Token": tok,
                   "Expiration": rfc3339_in(life(n))})
            .to_string(),
        ))
    }))
}

#[test]
fn container_endpoint_with_authorization_token_file_and_refresh() {
    let issued = take(2);
    let dir = TempDir::new("container");
    let token_file = dir.path().join("eks-pod-identity-token");
    std::fs::write(&token_file, "pod-identity-token-1").unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let fake = container_fake(issued.clone(), token_file.clone(), calls.clone(), lifetime);
    let uri = format!("{}/v1/credentials", fake.url());
    let e = env(&[
        ("AWS_CONTAINER_CREDENTIALS_FULL_URI", &uri),
        (
            "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
            token_file.to_str().unwrap(),
        ),
        // Not used: the file wins, as in the SDKs.
        ("AWS_CONTAINER_AUTHORIZATION_TOKEN", "stale-token"),
    ]);
    let s = sink("creds-container", &e).unwrap();
    let provider = s.client().credentials();
    assert_eq!(
        provider.source().to_string(),
        format!("container credentials endpoint {uri}")
    );
    put(&s, "container/1", &issued[0].0);
    std::fs::write(&token_file, "pod-identity-token-2").unwrap();
    wait_until("the refresh", || provider.fetches() >= 2);
    put(&s, "container/2", &issued[1].0);
    // The token from the variable, when no file is named.
    let by_variable = env(&[
        ("AWS_CONTAINER_CREDENTIALS_FULL_URI", &uri),
        ("AWS_CONTAINER_AUTHORIZATION_TOKEN", "pod-identity-token-2"),
    ]);
    put(
        &sink("creds-container", &by_variable).unwrap(),
        "container/3",
        &issued[1].0,
    );
    assert_eq!(
        stored("creds-container"),
        ["container/1", "container/2", "container/3"]
    );
    assert_eq!(boto3_access_key(&e), issued[1].0);
    assert_eq!(calls.load(Ordering::SeqCst), 4);
    fake.assert_strict();
}

/// The instance metadata service as documented for IMDSv2: a session token from `PUT
/// /latest/api/token` (TTL header required, 1 to 21600), then every GET with that token (a
/// GET without one, IMDSv1, is a violation and gets 401).
fn imds_fake(creds: Vec<Creds>, fail_from: usize, calls: Arc<AtomicUsize>) -> Fake {
    let tokens = Arc::new(Mutex::new(Vec::<String>::new()));
    Fake::start(Arc::new(move |r: &Req| {
        // https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/configuring-instance-metadata-service.html
        require(
            !r.headers.contains_key("x-forwarded-for"),
            "X-Forwarded-For (IMDS refuses proxied token requests)",
        )?;
        if r.path == "/latest/api/token" {
            require(r.method == "PUT", "token not requested with PUT")?;
            let ttl: u32 = r
                .headers
                .get("x-aws-ec2-metadata-token-ttl-seconds")
                .and_then(|v| v.parse().ok())
                .ok_or("no X-aws-ec2-metadata-token-ttl-seconds")?;
            require((1..=21600).contains(&ttl), "TTL out of 1..=21600")?;
            let mut t = tokens.lock().unwrap();
            let token = format!("AQAEA-imds-token-{}", t.len());
            t.push(token.clone());
            return Ok((200, "text/plain", token));
        }
        require(r.method == "GET", "not GET")?;
        let token = r
            .headers
            .get("x-aws-ec2-metadata-token")
            .ok_or("IMDSv1 request (no X-aws-ec2-metadata-token)")?;
        require(
            tokens.lock().unwrap().contains(token),
            "unknown session token",
        )?;
        match r.path.as_str() {
            "/latest/meta-data/iam/security-credentials/" => {
                Ok((200, "text/plain", "svc-instance-role".into()))
            }
            "/latest/meta-data/iam/security-credentials/svc-instance-role" => {
                let n = calls.fetch_add(1, Ordering::SeqCst);
                if n >= fail_from {
                    return Ok((500, "text/plain", "metadata service unavailable".into()));
                }
                let (id, secret, tok) = &creds[n.min(creds.len() - 1)];
                // The second set lasts 14 s: its refresh (at 7 s) fails, and it stays in use.
                let life = if n == 1 { 14 } else { lifetime(n) };
                Ok((
                    200,
                    "text/plain",
                    json!({"Code": "Success", "LastUpdated": rfc3339_in(0), "Type": "AWS-HMAC",
                           "AccessKeyId": id, "SecretAccessKey": secret, "Token": tok,
                           "Expiration": rfc3339_in(life)})
                    .to_string(),
                ))
            }
            other => Err(format!("unexpected path {other}")),
        }
    }))
}

#[test]
fn imds_v2_refreshes_and_a_failed_refresh_keeps_the_valid_credentials() {
    let issued = take(2);
    let calls = Arc::new(AtomicUsize::new(0));
    let fake = imds_fake(issued.clone(), 2, calls.clone());
    let e = env(&[("AWS_EC2_METADATA_SERVICE_ENDPOINT", &fake.url())]);
    let s = sink("creds-imds", &e).unwrap();
    let provider = s.client().credentials();
    assert_eq!(
        provider.source().to_string(),
        format!(
            "instance metadata (IMDSv2) at {}, role svc-instance-role",
            fake.url()
        )
    );
    put(&s, "imds/1", &issued[0].0);
    wait_until("the refresh", || provider.fetches() >= 2);
    put(&s, "imds/2", &issued[1].0);
    // The next refresh fails; the valid credentials stay in use.
    wait_until("a failed refresh", || calls.load(Ordering::SeqCst) >= 3);
    put(&s, "imds/3", &issued[1].0);
    assert_eq!(provider.fetches(), 2);
    assert_eq!(stored("creds-imds"), ["imds/1", "imds/2", "imds/3"]);
    fake.assert_strict();
}

#[test]
fn credential_process_runs_without_a_shell_and_is_refreshed() {
    let issued = take(2);
    let dir = TempDir::new("process");
    // A directory with a blank in its name, passed quoted: the line is split as botocore
    // does, not handed to a shell.
    let state = dir.path().join("state dir");
    std::fs::create_dir(&state).unwrap();
    for (i, (id, secret, tok)) in issued.iter().enumerate() {
        let answer = json!({"Version": 1, "AccessKeyId": id, "SecretAccessKey": secret,
                            "SessionToken": tok, "Expiration": rfc3339_in(lifetime(i))});
        std::fs::write(
            state.join(format!("answer-{}.json", i + 1)),
            answer.to_string(),
        )
        .unwrap();
    }
    let helper = dir.path().join("helper.sh");
    std::fs::write(
        &helper,
        "#!/bin/sh\nn=$(cat \"$1/count\" 2>/dev/null || echo 0)\nn=$((n + 1))\n\
         echo $n > \"$1/count\"\n[ $n -gt 2 ] && n=2\ncat \"$1/answer-$n.json\"\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&helper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let config = dir.path().join("config");
    std::fs::write(
        &config,
        format!(
            "[profile proc]\ncredential_process = {} '{}'\n",
            helper.display(),
            state.display()
        ),
    )
    .unwrap();
    let e = env(&[
        ("AWS_CONFIG_FILE", config.to_str().unwrap()),
        (
            "AWS_SHARED_CREDENTIALS_FILE",
            dir.path().join("none").to_str().unwrap(),
        ),
        ("AWS_PROFILE", "proc"),
    ]);
    let s = sink("creds-process", &e).unwrap();
    let provider = s.client().credentials();
    assert_eq!(
        provider.source().to_string(),
        "profile proc: credential_process"
    );
    put(&s, "process/1", &issued[0].0);
    wait_until("the refresh", || provider.fetches() >= 2);
    put(&s, "process/2", &issued[1].0);
    assert_eq!(stored("creds-process"), ["process/1", "process/2"]);
}

/// `svc test-sink` names the source that answered, never a key.
#[test]
fn test_sink_logs_the_source_that_answered() {
    let issued = take(1);
    let (id, secret, token) = issued[0].clone();
    let calls = Arc::new(AtomicUsize::new(1)); // long-lived answers only
    let fake = imds_fake(issued, usize::MAX, calls);
    let m = &store().0;
    m.create_bucket("creds-cli", false);
    let dir = TempDir::new("cli");
    let cfg = dir.path().join("c.json");
    std::fs::write(
        &cfg,
        json!({
            "nats": {"url": "nats://127.0.0.1:4222", "stream": "S", "consumer": "c", "subject": "a.>"},
            "sink": {"type": "object_store", "bucket": "creds-cli", "endpoint_url": m.endpoint(),
                     "allow_http_for_local_testing": true},
        })
        .to_string(),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_svc"))
        .arg("test-sink")
        .arg(&cfg)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap())
        .env("HOME", dir.path())
        .env("AWS_EC2_METADATA_SERVICE_ENDPOINT", fake.url())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains(&format!(
            "credentials from instance metadata (IMDSv2) at {}, role svc-instance-role \
             (temporary, expire ",
            fake.url()
        )),
        "{stdout}"
    );
    for secret in [&id, &secret, &token] {
        assert!(!stdout.contains(secret.as_str()) && !stderr.contains(secret.as_str()));
    }
    // boto3's IMDS provider gets the same answer from the fake.
    let mut e = env(&[("AWS_EC2_METADATA_SERVICE_ENDPOINT", &fake.url())]);
    e.insert("AWS_EC2_METADATA_DISABLED".into(), "false".into());
    assert_eq!(boto3_access_key(&e), id);
    fake.assert_strict();
}

/// `svc run` end to end with the container source: every message lands in the store signed
/// with the endpoint's credentials, and the log names the source, never a key.
#[test]
fn svc_run_stores_with_container_credentials_and_logs_the_source() {
    let issued = take(1);
    let (id, secret, token) = issued[0].clone();
    let dir = TempDir::new("run");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "run-token").unwrap();
    let fake = container_fake(
        issued,
        token_file.clone(),
        Arc::new(AtomicUsize::new(0)),
        |_| 3600,
    );
    let server = crate::support::broker::NatsServer::start();
    server.create_stream("ORDERS", &["orders.>"]);
    server.create_consumer("ORDERS", "svc", "orders.>", Duration::from_secs(30));
    server.publish_n("ORDERS", "orders.created", 5, |i| {
        format!("{{\"order\":{i}}}").into_bytes()
    });
    let m = &store().0;
    m.create_bucket("creds-run", false);
    let cfg = crate::support::write_config(
        dir.path(),
        "c.json",
        &json!({
            "nats": {"url": server.url(), "stream": "ORDERS", "consumer": "svc",
                     "subject": "orders.>"},
            "delivery": {"batch_size": 16, "fetch_expiry_ms": 200},
            "sink": {"type": "object_store", "bucket": "creds-run", "endpoint_url": m.endpoint(),
                     "allow_http_for_local_testing": true, "key_strategy": "stream_sequence"},
            "logging": {"level": "info"}
        }),
    );
    let log = dir.path().join("svc.log");
    let uri = format!("{}/v1/credentials", fake.url());
    let mut runner = crate::support::process::Runner::spawn(
        crate::support::process::svc_run(&cfg)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap())
            .env("HOME", dir.path())
            .env("RUST_LOG", "info")
            .env("AWS_CONTAINER_CREDENTIALS_FULL_URI", &uri)
            .env("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", &token_file),
        &log,
    );
    crate::support::wait_until(Duration::from_secs(60), "5 messages acked", || {
        server.try_consumer_state("ORDERS", "svc") == Some((5, 0, 0))
    });
    let keys = stored("creds-run");
    assert_eq!(keys.len(), 5, "{keys:?}");
    runner.signal("TERM");
    let status = runner.wait_timeout(Duration::from_secs(20)).expect("exits");
    let text = runner.log_text();
    assert!(status.success(), "{text}");
    assert!(
        text.contains(&format!(
            "credentials from container credentials endpoint {uri} (temporary, expire "
        )),
        "{text}"
    );
    for secret in [&id, &secret, &token] {
        assert!(!text.contains(secret.as_str()), "a credential in the log");
    }
    fake.assert_strict();
}
