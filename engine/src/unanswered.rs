//! Requests read and not yet answered, by their ids.
//!
//! The drain that ends a session is bounded: `shutdown` waits
//! `drain_timeout` for the requests before it, and the server gives them a
//! few seconds more before the process exits. A request still running then
//! must not leave its client waiting for an answer that never comes. Each
//! request's ids are noted here once its line is parsed; when the drain ends
//! before it, the drain takes the note and answers `3002` in its place, and
//! the request's own answer, if it ever comes, is dropped, so no id is
//! answered twice.

use crate::protocol::{batch_line, error_line, ErrorCode, RpcError};
use serde_json::value::RawValue;
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

/// The ids a line's answer must carry.
enum Awaited {
    /// A single request.
    One(Box<RawValue>),
    /// A JSON-RPC batch: its members with ids, in order.
    Batch(Vec<Box<RawValue>>),
}

#[derive(Default)]
pub struct Unanswered {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// By admission number.
    open: HashMap<u64, Awaited>,
    /// Admission numbers the drain answered in the request's place.
    abandoned: HashSet<u64>,
}

impl Unanswered {
    /// Notes that the request admitted as `seq` is to be answered under `id`.
    pub fn expect_one(&self, seq: u64, id: &RawValue) {
        self.lock().open.insert(seq, Awaited::One(id.to_owned()));
    }

    /// Notes that the JSON-RPC batch admitted as `seq` is to be answered
    /// under `ids` (its members that are not notifications).
    pub fn expect_batch(&self, seq: u64, ids: Vec<Box<RawValue>>) {
        if !ids.is_empty() {
            self.lock().open.insert(seq, Awaited::Batch(ids));
        }
    }

    /// Called when the request admitted as `seq` has its answer: whether it
    /// may still send it (false when the drain already answered for it).
    pub fn settle(&self, seq: u64) -> bool {
        let mut state = self.lock();
        state.open.remove(&seq);
        !state.abandoned.remove(&seq)
    }

    /// The drain has ended: answers every noted request but `except` (the
    /// `shutdown` that ended it) with `3002`, one line each, and marks them
    /// answered.
    pub fn abandon(&self, except: Option<u64>, drain_timeout: Duration) -> Vec<Vec<u8>> {
        let error = abandoned(drain_timeout);
        let mut state = self.lock();
        let taken: Vec<(u64, Awaited)> = state.open.extract_if(|&seq, _| Some(seq) != except).collect();
        state.abandoned.extend(taken.iter().map(|(seq, _)| *seq));
        taken
            .into_iter()
            .map(|(_, awaited)| match awaited {
                Awaited::One(id) => error_line(&id, &error),
                Awaited::Batch(ids) => batch_line(&ids.iter().map(|id| error_line(id, &error)).collect::<Vec<_>>()),
            })
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state stays consistent across a panic in a holder: every
        // change is a single insert or remove.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// What an abandoned request is answered. Short: a batch member's answer
/// must fit the share of the line its batch was admitted with, so the
/// message already says what to do (the detail is not repeated after it).
fn abandoned(drain_timeout: Duration) -> RpcError {
    RpcError::new(
        ErrorCode::Timeout,
        format!(
            "request abandoned: the engine shut down before it finished (drain_timeout {} ms). Send it to a new engine.",
            drain_timeout.as_millis()
        ),
        "Send it to a new engine.",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(text: &str) -> Box<RawValue> {
        RawValue::from_string(text.to_owned()).unwrap()
    }

    #[test]
    fn the_drain_answers_what_is_still_open_and_the_late_answer_is_dropped() {
        let open = Unanswered::default();
        open.expect_one(1, &id("\"a\""));
        open.expect_batch(2, vec![id("7"), id("\"b\"")]);
        open.expect_one(3, &id("\"bye\""));
        open.expect_batch(4, Vec::new());
        assert!(open.settle(1), "answered before the drain ended");
        let lines = open.abandon(Some(3), Duration::from_secs(30));
        assert_eq!(lines.len(), 1, "only the batch was still open (shutdown is exempt)");
        let batch: serde_json::Value = serde_json::from_slice(&lines[0]).unwrap();
        assert_eq!(batch[0]["id"], 7);
        assert_eq!(batch[1]["id"], "b");
        assert_eq!(batch[0]["error"]["code"], 3002);
        assert!(batch[1]["error"]["message"].as_str().unwrap().contains("drain_timeout 30000 ms"));
        assert!(!open.settle(2), "the drain answered it already");
        assert!(open.settle(3), "shutdown answers itself");
        assert!(open.settle(4), "a batch of notifications was never noted");
        assert!(open.abandon(None, Duration::from_secs(1)).is_empty());
    }

    #[test]
    fn an_abandoned_member_fits_the_smallest_share_a_batch_is_admitted_with() {
        let longest = format!("\"{}\"", "i".repeat(crate::protocol::MAX_ID_BYTES - 2));
        let open = Unanswered::default();
        open.expect_one(1, &id(&longest));
        let line = &open.abandon(None, Duration::from_secs(100 * 366 * 24 * 3600))[0];
        assert!(
            line.len() <= crate::protocol::MAX_ID_BYTES + crate::server::MIN_MEMBER_RESPONSE_BYTES,
            "{}",
            line.len()
        );
    }
}
