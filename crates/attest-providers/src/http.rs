//! The one way the engine talks to model providers over HTTP: a JSON POST
//! with bounded concurrency, optional pacing, retries and deadlines.
//!
//! Retry policy (Attest protocol v1 §5, `2001 PROVIDER_ERROR`): at most
//! [`MAX_ATTEMPTS`] attempts, retrying on 408, 429, 5xx, per-attempt
//! time-outs and connection errors, with exponential backoff and full
//! jitter. A `Retry-After` header (seconds) replaces the computed wait. A
//! wait that would outlast the request's deadline is not started: the
//! failure is reported at once instead.

use super::ProviderError;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Mutex, Semaphore};
use tokio::time::Instant;

/// Attempts per provider call, the first one included.
pub const MAX_ATTEMPTS: u32 = 3;
/// Backoff before the second attempt; doubled for each later one.
const BASE_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(8);
/// Longest provider reply read, in bytes.
const MAX_REPLY_BYTES: usize = 16 * 1024 * 1024;

/// Shared by every provider call of the process.
#[derive(Clone)]
pub struct HttpClient {
    inner: reqwest::Client,
    /// Calls in flight at once (separate from request admission, so that
    /// slow providers never hold the threads that evaluate layers 1–4).
    permits: Arc<Semaphore>,
    max_concurrency: usize,
    pacer: Option<Arc<Pacer>>,
    attempt_timeout: Duration,
}

/// Spaces requests evenly at `per_second` (no bursts).
struct Pacer {
    interval: Duration,
    next: Mutex<Instant>,
}

impl Pacer {
    async fn wait(&self) {
        let slot = {
            let mut next = self.next.lock().await;
            let slot = (*next).max(Instant::now());
            *next = slot + self.interval;
            slot
        };
        tokio::time::sleep_until(slot).await;
    }
}

/// One header: name and value.
pub type Header = (&'static str, String);

impl HttpClient {
    pub fn new(max_concurrency: usize, requests_per_second: Option<f64>, attempt_timeout: Duration) -> HttpClient {
        let inner = reqwest::Client::builder()
            .user_agent(concat!("attest-engine/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(10))
            .build()
            .expect("the TLS backend is compiled in");
        HttpClient {
            inner,
            permits: Arc::new(Semaphore::new(max_concurrency.max(1))),
            max_concurrency: max_concurrency.max(1),
            pacer: requests_per_second
                .and_then(|r| Duration::try_from_secs_f64(1.0 / r).ok())
                .map(|interval| {
                    Arc::new(Pacer {
                        interval,
                        next: Mutex::new(Instant::now()),
                    })
                }),
            attempt_timeout,
        }
    }

    /// The same client (connections, settings) with concurrency slots and
    /// pacing of its own, for another provider.
    pub fn with_own_limits(&self) -> HttpClient {
        HttpClient {
            inner: self.inner.clone(),
            permits: Arc::new(Semaphore::new(self.max_concurrency)),
            max_concurrency: self.max_concurrency,
            pacer: self.pacer.as_ref().map(|p| {
                Arc::new(Pacer {
                    interval: p.interval,
                    next: Mutex::new(Instant::now()),
                })
            }),
            attempt_timeout: self.attempt_timeout,
        }
    }

    /// POSTs `body` to `url` and returns the reply's JSON, retrying as the
    /// module documents. `what` names the call in errors ("judge", "embedding").
    pub async fn post_json(
        &self,
        what: &str,
        url: &str,
        headers: &[Header],
        body: &Value,
        deadline: Instant,
    ) -> Result<Value, ProviderError> {
        let mut attempt = 1;
        loop {
            let mut failure = match self.attempt(url, headers, body, deadline).await {
                Ok(v) => return Ok(v),
                Err(f) => f,
            };
            // A provider may echo the credential it was sent (in an error body,
            // or a URL in a transport error): it never reaches a log or an answer.
            failure.message = mask_credentials(&failure.message, headers);
            if failure.deadline {
                return Err(ProviderError::Timeout);
            }
            let err = |detail: String| ProviderError::failed(format!("{what} provider {detail}"), attempt);
            if !failure.retryable {
                return Err(ProviderError::refused(format!("{what} provider {}", failure.message), attempt));
            }
            if attempt >= MAX_ATTEMPTS {
                return Err(err(failure.message));
            }
            let wait = failure.retry_after.unwrap_or_else(|| backoff(attempt));
            // A Retry-After of any size is a wait past the deadline, never an
            // overflow.
            if Instant::now().checked_add(wait).is_none_or(|resume| resume >= deadline) {
                return Err(match failure.retry_after {
                    Some(after) => err(format!(
                        "{} (Retry-After {}s is past the evaluation deadline)",
                        failure.message,
                        after.as_secs()
                    )),
                    None => err(failure.message),
                });
            }
            tracing::warn!(provider = what, attempt, wait_ms = wait.as_millis() as u64, error = %failure.message, "provider call failed; retrying");
            tokio::time::sleep(wait).await;
            attempt += 1;
        }
    }

    async fn attempt(&self, url: &str, headers: &[Header], body: &Value, deadline: Instant) -> Result<Value, Failure> {
        let _permit = tokio::time::timeout_at(deadline, self.permits.acquire())
            .await
            .map_err(|_| Failure::deadline())?
            .expect("the semaphore is never closed");
        if let Some(p) = &self.pacer {
            tokio::time::timeout_at(deadline, p.wait()).await.map_err(|_| Failure::deadline())?;
        }
        let now = Instant::now();
        let limit = (now + self.attempt_timeout).min(deadline);
        let mut req = self.inner.post(url).json(body);
        for (k, v) in headers {
            req = req.header(*k, v);
        }
        let send = async {
            let resp = req.send().await.map_err(Failure::transport)?;
            let status = resp.status();
            let retry_after = resp
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs);
            let bytes = read_capped(resp).await?;
            if !status.is_success() {
                let code = status.as_u16();
                return Err(Failure {
                    message: format!("returned HTTP {code}: {}", error_text(&bytes)),
                    retryable: code == 408 || code == 429 || status.is_server_error(),
                    retry_after,
                    deadline: false,
                });
            }
            serde_json::from_slice::<Value>(&bytes).map_err(|e| Failure {
                message: format!(
                    "returned a reply that is not JSON ({e}): {}",
                    crate::text::quote(&String::from_utf8_lossy(&bytes))
                ),
                retryable: true,
                retry_after: None,
                deadline: false,
            })
        };
        match tokio::time::timeout_at(limit, send).await {
            Ok(r) => r,
            Err(_) if limit >= deadline => Err(Failure::deadline()),
            Err(_) => Err(Failure {
                message: format!("did not answer within {}ms", self.attempt_timeout.as_millis()),
                retryable: true,
                retry_after: None,
                deadline: false,
            }),
        }
    }
}

/// Why one attempt failed.
struct Failure {
    message: String,
    retryable: bool,
    retry_after: Option<Duration>,
    /// The evaluation deadline ran out (→ `3002`, never retried).
    deadline: bool,
}

impl Failure {
    fn deadline() -> Failure {
        Failure {
            message: "evaluation deadline reached".into(),
            retryable: false,
            retry_after: None,
            deadline: true,
        }
    }

    fn transport(e: reqwest::Error) -> Failure {
        let what = if e.is_connect() {
            "could not be reached"
        } else if e.is_timeout() {
            "timed out"
        } else {
            "failed"
        };
        Failure {
            message: format!("{what}: {}", attest_trace::text::error_chain(&e)),
            retryable: true,
            retry_after: None,
            deadline: false,
        }
    }
}

async fn read_capped(mut resp: reqwest::Response) -> Result<Vec<u8>, Failure> {
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(Failure::transport)? {
        if out.len() + chunk.len() > MAX_REPLY_BYTES {
            return Err(Failure {
                message: format!("sent a reply over {MAX_REPLY_BYTES} bytes"),
                retryable: false,
                retry_after: None,
                deadline: false,
            });
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// `text` with every credential sent in `headers` (a bearer token, an API
/// key header) replaced by a name for it.
pub(crate) fn mask_credentials(text: &str, headers: &[Header]) -> String {
    let mut out = text.to_owned();
    for (name, value) in headers {
        if !matches!(*name, "authorization" | "x-api-key") {
            continue;
        }
        let secret = value.strip_prefix("Bearer ").unwrap_or(value).trim();
        if secret.len() >= 4 && out.contains(secret) {
            out = out.replace(secret, &format!("[secret '{name}']"));
        }
    }
    out
}

/// The provider's own error message when it sent one, else the body, clipped.
fn error_text(body: &[u8]) -> String {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let message = parsed.as_ref().and_then(|v| {
        v.pointer("/error/message")
            .or_else(|| v.get("error"))
            .or_else(|| v.get("message"))
            .and_then(Value::as_str)
    });
    match message {
        Some(m) => crate::text::clip(m, 200),
        None if body.is_empty() => "(empty body)".into(),
        None => crate::text::clip(&String::from_utf8_lossy(body), 200),
    }
}

/// Exponential backoff with full jitter: a random wait in [d/2, d].
fn backoff(attempt: u32) -> Duration {
    let d = BASE_BACKOFF.saturating_mul(1 << (attempt - 1).min(10)).min(MAX_BACKOFF);
    d.mul_f64(0.5 + fastrand::f64() * 0.5)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        for _ in 0..100 {
            let b1 = backoff(1);
            assert!(b1 >= BASE_BACKOFF / 2 && b1 <= BASE_BACKOFF);
            let b3 = backoff(3);
            assert!(b3 >= BASE_BACKOFF * 2 && b3 <= BASE_BACKOFF * 4);
            assert!(backoff(30) <= MAX_BACKOFF);
        }
    }

    #[test]
    fn credentials_are_masked_in_failures() {
        let headers = vec![
            ("authorization", "Bearer sk-test-123456".to_owned()),
            ("x-api-key", "ak-987654".to_owned()),
        ];
        let said = "Incorrect API key provided: sk-test-123456 (and ak-987654)";
        assert_eq!(
            mask_credentials(said, &headers),
            "Incorrect API key provided: [secret 'authorization'] (and [secret 'x-api-key'])"
        );
    }

    #[test]
    fn error_text_prefers_the_providers_message() {
        assert_eq!(error_text(br#"{"error":{"message":"rate limit exceeded"}}"#), "rate limit exceeded");
        assert_eq!(error_text(b"oops"), "oops");
        assert_eq!(error_text(b""), "(empty body)");
    }
}
