//! Delivery of drift alerts: the opt-in `drift_alert` notification line and
//! the optional webhook POST (`drift_webhook_url`).
//!
//! Webhook posts run in the background with a timeout and a small
//! concurrency bound, so a slow or dead receiver never delays a response.

use crate::history::DriftReport;
use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// Posts in flight at once; further alerts wait for a slot in the background.
const MAX_POSTS_IN_FLIGHT: usize = 4;
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
        })
    }

    /// Posts `report` in the background; failures are logged.
    pub fn send(&self, report: DriftReport) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!("drift webhook skipped: no async runtime (eval command)");
            return;
        };
        let (url, client, slots) = (self.url.clone(), self.client.clone(), self.slots.clone());
        runtime.spawn(async move {
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
    }
}
