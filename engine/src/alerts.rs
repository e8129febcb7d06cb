//! Delivery of drift alerts: the opt-in `drift_alert` notification line and
//! the optional webhook POST (`drift_webhook_url`).
//!
//! Webhook posts run in the background with a timeout and a small
//! concurrency bound, so a slow or dead receiver never delays a response.
//! Alerts waiting for a slot are bounded too: past [`MAX_POSTS_PENDING`],
//! new alerts are dropped and logged rather than piling up.

use crate::history::DriftReport;
use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// Posts in flight at once; further alerts wait for a slot in the background.
const MAX_POSTS_IN_FLIGHT: usize = 4;
/// Alerts posting or waiting to post; beyond this they are dropped. A dead
/// receiver takes up to [`POST_TIMEOUT`] per post, so this is minutes of
/// alerts, while each waiting one holds only its report.
const MAX_POSTS_PENDING: usize = 256;
const POST_TIMEOUT: Duration = Duration::from_secs(10);

/// The `drift_alert` notification line for one report.
pub fn notification(report: &DriftReport) -> Option<Vec<u8>> {
    serde_json::to_vec(&serde_json::json!({"jsonrpc": "2.0", "method": "drift_alert", "params": report})).ok()
}

/// What the webhook receives: a `text` line chat tools show as is
/// (Slack-compatible), and the full report.
#[derive(Serialize)]
struct WebhookBody<'a> {
    text: String,
    alert: &'a DriftReport,
}

pub struct Webhook {
    url: reqwest::Url,
    client: reqwest::Client,
    slots: Arc<Semaphore>,
    pending: Arc<Semaphore>,
}

impl Webhook {
    /// Checks the URL; only `http` and `https` are accepted.
    pub fn new(url: &str) -> anyhow::Result<Webhook> {
        let url = reqwest::Url::parse(url).map_err(|e| anyhow::anyhow!("drift_webhook_url '{url}' is not a URL: {e}"))?;
        if !matches!(url.scheme(), "http" | "https") {
            anyhow::bail!(
                "drift_webhook_url must be an http:// or https:// URL, got scheme '{}'",
                url.scheme()
            );
        }
        let client = reqwest::Client::builder().timeout(POST_TIMEOUT).build()?;
        Ok(Webhook {
            url,
            client,
            slots: Arc::new(Semaphore::new(MAX_POSTS_IN_FLIGHT)),
            pending: Arc::new(Semaphore::new(MAX_POSTS_PENDING)),
        })
    }

    /// Posts `report` in the background; failures are logged. Returns
    /// whether it was queued (false: no runtime, or too many pending).
    pub fn send(&self, report: DriftReport) -> bool {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!("drift webhook skipped: no async runtime to post from");
            return false;
        };
        let Ok(pending) = self.pending.clone().try_acquire_owned() else {
            tracing::warn!(
                assertion_id = %report.assertion_id,
                pending = MAX_POSTS_PENDING,
                "drift alert dropped: the webhook is not keeping up"
            );
            return false;
        };
        let (url, client, slots) = (self.url.clone(), self.client.clone(), self.slots.clone());
        runtime.spawn(async move {
            let _pending = pending;
            let Ok(_slot) = slots.acquire_owned().await else { return };
            let body = WebhookBody {
                text: format!(
                    "[attest] drift alert: assertion {} scored {:.4}, below mean {:.4} (stddev {:.4}) over {} results",
                    report.assertion_id, report.latest_score, report.mean, report.stddev, report.count
                ),
                alert: &report,
            };
            match client.post(url.clone()).json(&body).send().await {
                Ok(r) if r.status().is_success() => tracing::info!(assertion_id = %report.assertion_id, "drift alert posted"),
                Ok(r) => tracing::warn!(status = %r.status(), url = %url, "drift webhook refused the alert"),
                Err(e) => tracing::warn!(error = %e, url = %url, "drift webhook failed"),
            }
        });
        true
    }
}

impl Webhook {
    /// Waits until every queued post has been sent (or failed), or until
    /// `deadline`. A one-shot command calls it before its runtime ends, which
    /// would otherwise drop the posts still waiting.
    pub async fn settle(&self, deadline: std::time::Instant) {
        let all = MAX_POSTS_PENDING as u32;
        let wait = deadline.saturating_duration_since(std::time::Instant::now());
        let waiting = MAX_POSTS_PENDING - self.pending.available_permits();
        if waiting == 0 {
            return;
        }
        if tokio::time::timeout(wait, self.pending.acquire_many(all)).await.is_err() {
            tracing::warn!(waiting, "drift alerts still posting when the run ended were not sent");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::DriftStatus;

    fn report(i: usize) -> DriftReport {
        DriftReport {
            assertion_id: format!("a{i}"),
            fingerprint: None,
            mean: 0.9,
            stddev: 0.01,
            count: 30,
            latest_score: 0.2,
            deviation: 70.0,
            status: DriftStatus::DriftDetected,
            window_size: 30,
        }
    }

    #[tokio::test]
    async fn alerts_waiting_for_a_dead_receiver_are_bounded() {
        // A receiver that accepts connections and never answers.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = listener.accept().await {
                held.push(s);
            }
        });
        let hook = Webhook::new(&url).unwrap();
        let queued = (0..MAX_POSTS_PENDING + 40).filter(|&i| hook.send(report(i))).count();
        assert_eq!(queued, MAX_POSTS_PENDING);
        assert_eq!(hook.pending.available_permits(), 0);
    }
}
