//! An agent at an `http(s)://` URL, spoken to over Streamable HTTP: a JSON
//! reply, or server-sent events whose last response is the answer.

use super::*;

pub struct HttpAgent {
    endpoint: String,
    client: reqwest::Client,
    next_id: i64,
}

impl HttpAgent {
    pub fn new(endpoint: &str) -> Result<HttpAgent, CallError> {
        // Redirects are not followed: the reference runtime reports a 3xx as a
        // transport error, and following one would re-send the agent's
        // requests (a 307 re-POSTs) to another endpoint than the manifest
        // names.
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| CallError::new(ExitReason::TransportError, format!("HTTP client setup failed: {e}")))?;
        Ok(HttpAgent {
            endpoint: endpoint.to_string(),
            client,
            next_id: 0,
        })
    }

    pub async fn call(&mut self, method: &str, params: Value, timeout: Duration) -> Result<Value, CallError> {
        self.next_id += 1;
        let id = self.next_id;
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let timed_out = || {
            CallError::new(
                ExitReason::Timeout,
                format!("agent did not answer {method} within {:.1}s", timeout.as_secs_f64()),
            )
        };
        let exchange = async {
            let mut resp = self
                .client
                .post(&self.endpoint)
                .header("Accept", "application/json, text/event-stream")
                .header("Content-Type", "application/json")
                .body(body.to_string())
                .send()
                .await
                .map_err(|e| {
                    if e.is_timeout() {
                        timed_out()
                    } else {
                        CallError::new(
                            ExitReason::TransportError,
                            format!("HTTP request to {} failed: {}", self.endpoint, error_chain(&e)),
                        )
                    }
                })?;
            let status = resp.status();
            if status.is_redirection() {
                let location = resp
                    .headers()
                    .get(reqwest::header::LOCATION)
                    .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
                return Err(CallError::new(
                    ExitReason::TransportError,
                    format!(
                        "HTTP {status} from {}: {}; redirects are not followed, so give the agent's own endpoint as the target",
                        self.endpoint,
                        match location {
                            Some(l) => format!("it redirects to {:?}", clip(&l, 500)),
                            None => "a redirect without a Location".into(),
                        }
                    ),
                ));
            }
            let content_type = resp
                .headers()
                .get(reqwest::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_ascii_lowercase();
            let stream = content_type.contains("text/event-stream");
            let (mut raw, mut events, mut received) = (Vec::new(), SseEvents::default(), 0usize);
            while let Some(chunk) = resp.chunk().await.map_err(|e| {
                CallError::new(
                    ExitReason::TransportError,
                    format!("reading the HTTP response failed: {}", error_chain(&e)),
                )
            })? {
                received += chunk.len();
                if received > MAX_HTTP_BODY {
                    return Err(CallError::new(
                        ExitReason::ProtocolError,
                        format!("HTTP response exceeds {MAX_HTTP_BODY} bytes"),
                    ));
                }
                if stream && status.is_success() {
                    // Each event is read once, as it completes: a stream
                    // of progress events costs time in proportion to its
                    // length. A server may keep the stream open after the
                    // response event.
                    if let Some(v) = events.push(&chunk) {
                        return Ok((status, v));
                    }
                } else {
                    raw.extend_from_slice(&chunk);
                }
            }
            if stream && status.is_success() {
                return events
                    .finish()
                    .map(|v| (status, v))
                    .ok_or_else(|| CallError::new(ExitReason::ProtocolError, "SSE stream ended without a JSON-RPC response"));
            }
            let text = String::from_utf8_lossy(&raw).into_owned();
            if !status.is_success() {
                return Err(CallError::new(
                    ExitReason::TransportError,
                    format!("HTTP {status} from {}: {}", self.endpoint, clip(&text, 500)),
                ));
            }
            if text.trim().is_empty() {
                return Err(CallError::new(
                    ExitReason::ProtocolError,
                    format!("empty HTTP response to {method} (status {status})"),
                ));
            }
            let v: Value = agent_json(&text).map_err(|e| {
                CallError::new(
                    ExitReason::ProtocolError,
                    format!("HTTP response is not valid JSON ({e}): {}", clip(&text, 300)),
                )
            })?;
            Ok((status, v))
        };
        let (status, v) = match tokio::time::timeout(timeout, exchange).await {
            Ok(r) => r?,
            Err(_) => return Err(timed_out()),
        };
        if !status.is_success() {
            return Err(CallError::new(
                ExitReason::TransportError,
                format!("HTTP {status} from {}", self.endpoint),
            ));
        }
        let Some(obj) = v.as_object() else {
            return Err(CallError::new(ExitReason::ProtocolError, "HTTP response must be a JSON-RPC object"));
        };
        if obj.get("id") != Some(&json!(id)) {
            return Err(CallError::new(
                ExitReason::ProtocolError,
                format!("JSON-RPC response id mismatch: expected {id}, got {}", clip_json(obj.get("id"))),
            ));
        }
        Ok(v)
    }
}

/// A server-sent event stream read as it arrives, for its first event whose
/// data is a JSON-RPC response. Only the event being received is kept.
#[derive(Default)]
pub(super) struct SseEvents {
    /// The text after the last complete event, its line ends made `\n`:
    /// a line may end in CRLF, LF or a lone CR.
    pub(super) pending: Vec<u8>,
    /// How much of `pending` is known to hold no event boundary.
    scanned: usize,
    /// The last byte taken was a CR, so an LF that follows ends no line.
    after_cr: bool,
}

impl SseEvents {
    /// Takes the next part of the stream: the response, once an event
    /// completed by a blank line holds one.
    pub(super) fn push(&mut self, chunk: &[u8]) -> Option<Value> {
        for &b in chunk {
            match b {
                b'\r' => self.pending.push(b'\n'),
                b'\n' if self.after_cr => {}
                _ => self.pending.push(b),
            }
            self.after_cr = b == b'\r';
        }
        // Events start at `start`; boundaries are looked for from `from`.
        let (mut start, mut from, mut found) = (0, self.scanned, None);
        while let Some(i) = memchr::memmem::find(&self.pending[from..], b"\n\n") {
            let end = from + i;
            found = sse_response(&self.pending[start..end]);
            (start, from) = (end + 2, end + 2);
            if found.is_some() {
                break;
            }
        }
        self.pending.drain(..start);
        // The last byte may begin a boundary the next chunk completes.
        self.scanned = self.pending.len().saturating_sub(1);
        found
    }

    /// The stream ended: its last event needs no blank line after it.
    pub(super) fn finish(self) -> Option<Value> {
        sse_response(&self.pending)
    }
}

/// The JSON-RPC response one event's data holds, if it holds one.
fn sse_response(event: &[u8]) -> Option<Value> {
    let event = String::from_utf8_lossy(event);
    let data: Vec<&str> = event
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| d.strip_prefix(' ').unwrap_or(d))
        .collect();
    if data.is_empty() {
        return None;
    }
    serde_json::from_str::<Value>(&data.join("\n"))
        .ok()
        .filter(|v| v.get("result").is_some() || v.get("error").is_some())
}
