//! The invariants: what the engine owes each input line (from JSON-RPC 2.0
//! and the engine's README), and the checks applied to every stdout line.
//!
//! Expectations are computed from the bytes actually sent, never from what
//! the generator meant to send, so a mutation that happens to produce a valid
//! request is judged as one.

use crate::json::{self, Edges, Kind};
use serde_json::Value;
use std::fmt;

/// SDK readers fail on response lines longer than this (without the `\n`).
pub const MAX_RESPONSE_LINE: usize = 65_536;
/// Ids longer than this may be refused with a null-id `-32600`.
pub const MAX_ID_BYTES: usize = 1024;

/// Every property the fuzzer checks. The names are printed in summaries and
/// reproducer file names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Invariant {
    /// A request (or an invalid line) got no response.
    MissingResponse,
    /// A response nobody asked for: a notification answered, an id that was
    /// never sent, a request answered twice.
    UnexpectedResponse,
    /// A stdout line that is not a JSON-RPC 2.0 response object or an array of them.
    InvalidJsonRpc,
    /// A stdout line over 64 KiB.
    LineTooLong,
    /// Error 3001 or -32603: an internal error is never the right answer.
    InternalError,
    /// `evaluate_batch` results not in request order.
    ResultOrder,
    /// A result score that is not a number in [0, 1].
    ScoreRange,
    /// No response within the deadline while the engine stayed silent.
    Hang,
    /// The engine did not exit within the drain limit after shutdown or end of input.
    ExitTimeout,
    /// The engine exited when it should not have, or with a failure status.
    EngineDied,
    /// The engine's peak RSS passed the ceiling.
    RssCeiling,
}

impl Invariant {
    pub const ALL: [Invariant; 11] = [
        Invariant::MissingResponse,
        Invariant::UnexpectedResponse,
        Invariant::InvalidJsonRpc,
        Invariant::LineTooLong,
        Invariant::InternalError,
        Invariant::ResultOrder,
        Invariant::ScoreRange,
        Invariant::Hang,
        Invariant::ExitTimeout,
        Invariant::EngineDied,
        Invariant::RssCeiling,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Invariant::MissingResponse => "missing-response",
            Invariant::UnexpectedResponse => "unexpected-response",
            Invariant::InvalidJsonRpc => "invalid-jsonrpc",
            Invariant::LineTooLong => "line-over-64KiB",
            Invariant::InternalError => "internal-error-3001",
            Invariant::ResultOrder => "result-order",
            Invariant::ScoreRange => "score-range",
            Invariant::Hang => "hang",
            Invariant::ExitTimeout => "exit-timeout",
            Invariant::EngineDied => "engine-died",
            Invariant::RssCeiling => "rss-ceiling",
        }
    }
}

impl fmt::Display for Invariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Violation {
    pub invariant: Invariant,
    pub detail: String,
}

impl Violation {
    pub fn new(invariant: Invariant, detail: impl Into<String>) -> Violation {
        Violation {
            invariant,
            detail: detail.into(),
        }
    }
}

/// What a request is, for checks on its result.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestInfo {
    pub method: String,
    /// For `evaluate_batch`: the `assertion_id`s in request order, when the
    /// params parse as plain JSON.
    pub assertion_ids: Option<Vec<Value>>,
}

/// One response the engine owes.
#[derive(Debug, Clone, PartialEq)]
pub enum Slot {
    /// A request with an id: one response under one of `ids` (raw text; a
    /// request with duplicate `id` keys has several). A null-id error also
    /// fills it when `null_ok` (duplicate keys, implementation limits,
    /// ids that are not strings or numbers, ids over 1 KiB).
    Id {
        ids: Vec<String>,
        null_ok: bool,
        request: Option<RequestInfo>,
    },
    /// Exactly one error response with id `null` (not JSON, not a request object).
    Null,
    /// At most one null-id error: a notification that a conforming parser may
    /// refuse (duplicate keys, implementation limits).
    MaybeNull,
    /// A batch whose array line is missing: only one null-id error refusing
    /// the whole batch (owed this many responses) can stand in for it.
    WholeBatch(usize),
}

impl Slot {
    fn required(&self) -> bool {
        !matches!(self, Slot::MaybeNull)
    }
}

/// What the engine owes one input line.
#[derive(Debug, Clone, PartialEq)]
pub enum Expect {
    /// A blank line or a notification: nothing.
    Nothing,
    /// One response object.
    One(Slot),
    /// A JSON-RPC batch: one array line holding a response per slot (no line
    /// at all when there are none). The engine may also refuse the whole
    /// batch with one null-id error object.
    Batch(Vec<Slot>),
}

impl Expect {
    /// How many stdout lines must arrive at least.
    pub fn required_lines(&self) -> usize {
        match self {
            Expect::Nothing => 0,
            Expect::One(s) => usize::from(s.required()),
            Expect::Batch(slots) => usize::from(slots.iter().any(Slot::required)),
        }
    }
}

/// The expectation for one input line (without its `\n`). `max_line` is the
/// engine's request line limit, past which a line is skipped unread.
pub fn expect_line(line: &[u8], max_line: usize) -> Expect {
    if line.len() > max_line {
        return oversized(line);
    }
    if line.iter().all(|&b| json::is_json_ws(b)) {
        return Expect::Nothing;
    }
    let Some(scanned) = json::scan_line(line) else {
        return Expect::One(Slot::Null);
    };
    match scanned.kind {
        Kind::Object => match object_slot(line, scanned.span, scanned.edges) {
            Some(slot) => Expect::One(slot),
            None => Expect::Nothing,
        },
        Kind::Array => {
            let elements = json::array_elements(line, scanned.span).unwrap_or_default();
            if elements.is_empty() {
                return Expect::One(Slot::Null);
            }
            let slots = elements
                .into_iter()
                .filter_map(|span| {
                    if line[span.start] != b'{' {
                        return Some(Slot::Null);
                    }
                    let edges = json::edges_of(line, span.clone());
                    object_slot(line, span, edges)
                })
                .collect();
            Expect::Batch(slots)
        }
        _ => Expect::One(Slot::Null),
    }
}

/// A line over the limit is skipped as it streams past: the engine can only
/// answer it under an id it sniffed from the start of the line, or null.
fn oversized(line: &[u8]) -> Expect {
    let start = line.iter().position(|&b| !json::is_json_ws(b)).unwrap_or(0);
    if line.get(start) != Some(&b'{') {
        return Expect::One(Slot::Null);
    }
    // Only the prefix is sniffed; look for a leading "id" member cheaply.
    let head = &line[..line.len().min(4096)];
    let text = String::from_utf8_lossy(head);
    let sniffed = text.find("\"id\":").and_then(|at| {
        let rest = &text.as_bytes()[at + 5..];
        let mut edges = Edges::default();
        let v0 = rest.iter().position(|&b| !json::is_json_ws(b))?;
        let end = json::skip_value(rest, v0, &mut edges)?;
        Some(String::from_utf8_lossy(&rest[v0..end]).into_owned())
    });
    match sniffed {
        Some(id) => Expect::One(Slot::Id {
            ids: vec![id],
            null_ok: true,
            request: None,
        }),
        None => Expect::One(Slot::MaybeNull),
    }
}

/// The slot of one request object (`None`: a valid notification).
fn object_slot(line: &[u8], span: std::ops::Range<usize>, edges: Edges) -> Option<Slot> {
    let Some(members) = json::object_members(line, span) else {
        return Some(Slot::Null);
    };
    let mut keys: Vec<&str> = members.iter().map(|(k, _)| k.as_str()).collect();
    keys.sort_unstable();
    let duplicate_keys = keys.windows(2).any(|w| w[0] == w[1]);
    let raw = |r: &std::ops::Range<usize>| String::from_utf8_lossy(&line[r.clone()]).into_owned();
    let member = |name: &str| members.iter().find(|(k, _)| k == name).map(|(_, r)| r.clone());
    let ids: Vec<String> = members.iter().filter(|(k, _)| k == "id").map(|(_, r)| raw(r)).collect();
    let method = member("method").and_then(|r| {
        let mut e = Edges::default();
        json::decode_string(line, r.start, &mut e).map(|(_, s)| s)
    });
    if ids.is_empty() {
        let jsonrpc_ok = member("jsonrpc").is_some_and(|r| raw(&r) == "\"2.0\"");
        let params_ok = member("params").is_none_or(|r| matches!(line[r.start], b'{' | b'[' | b'n'));
        if jsonrpc_ok && method.is_some() && params_ok && !duplicate_keys && !edges.is_edgy() {
            return None;
        }
        // JSON-RPC answers an invalid request under id null; a conforming
        // parser may also refuse one it cannot read.
        return Some(if duplicate_keys || edges.is_edgy() || jsonrpc_ok && method.is_some() {
            Slot::MaybeNull
        } else {
            Slot::Null
        });
    }
    let odd_id = ids
        .iter()
        .any(|id| id.len() > MAX_ID_BYTES || matches!(id.as_bytes().first(), Some(b'{' | b'[' | b't' | b'f')));
    let request = method.map(|method| {
        let assertion_ids = if method == "evaluate_batch" {
            member("params").and_then(|r| assertion_ids(&line[r]))
        } else {
            None
        };
        RequestInfo { method, assertion_ids }
    });
    Some(Slot::Id {
        ids,
        null_ok: duplicate_keys || edges.is_edgy() || odd_id,
        request,
    })
}

fn assertion_ids(params: &[u8]) -> Option<Vec<Value>> {
    let v: Value = serde_json::from_slice(params).ok()?;
    let list = v.get("assertions")?.as_array()?;
    Some(list.iter().map(|a| a.get("assertion_id").cloned().unwrap_or(Value::Null)).collect())
}

/// One response object read from stdout.
#[derive(Debug, Clone)]
pub struct Response {
    /// The id's raw text.
    pub id: String,
    pub body: Value,
}

impl Response {
    fn is_error(&self) -> bool {
        self.body.get("error").is_some()
    }

    fn id_is_null(&self) -> bool {
        self.id == "null"
    }

    fn has_id(&self, raw: &str) -> bool {
        if self.id == raw {
            return true;
        }
        match (serde_json::from_str::<Value>(&self.id), serde_json::from_str::<Value>(raw)) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        }
    }

    fn short(&self) -> String {
        clip(&self.body.to_string(), 600)
    }
}

/// A parsed stdout line.
#[derive(Debug, Clone)]
pub enum Reply {
    One(Response),
    Batch(Vec<Response>),
}

/// Checks one stdout line on its own (`len` is its full length, as `line` may
/// have been cut short for memory): its size, its JSON-RPC shape, internal
/// errors and scores. Returns the parsed reply when it is usable.
pub fn check_line(line: &[u8], len: usize, out: &mut Vec<Violation>) -> Option<Reply> {
    if len > MAX_RESPONSE_LINE {
        out.push(Violation::new(
            Invariant::LineTooLong,
            format!(
                "stdout line of {len} bytes (limit {MAX_RESPONSE_LINE}): {}",
                clip(&String::from_utf8_lossy(line), 300)
            ),
        ));
        if line.len() < len {
            return None;
        }
    }
    let invalid = |why: &str| {
        Violation::new(
            Invariant::InvalidJsonRpc,
            format!("{why}: {}", clip(&String::from_utf8_lossy(line), 300)),
        )
    };
    let Some(scanned) = json::scan_line(line) else {
        out.push(invalid("stdout line is not JSON"));
        return None;
    };
    let responses: Vec<std::ops::Range<usize>> = match scanned.kind {
        Kind::Object => vec![scanned.span],
        Kind::Array => {
            let members = json::array_elements(line, scanned.span).unwrap_or_default();
            if members.is_empty() {
                out.push(invalid("empty array line"));
                return None;
            }
            members
        }
        _ => {
            out.push(invalid("stdout line is not an object or an array"));
            return None;
        }
    };
    let mut parsed = Vec::new();
    for span in &responses {
        match check_response(line, span.clone(), out) {
            Some(r) => parsed.push(r),
            None => return None,
        }
    }
    Some(match scanned.kind {
        Kind::Object => Reply::One(parsed.pop().expect("one response")),
        _ => Reply::Batch(parsed),
    })
}

fn check_response(line: &[u8], span: std::ops::Range<usize>, out: &mut Vec<Violation>) -> Option<Response> {
    let text = String::from_utf8_lossy(&line[span.clone()]).into_owned();
    let invalid = |why: &str| Violation::new(Invariant::InvalidJsonRpc, format!("{why}: {}", clip(&text, 300)));
    let Some(members) = json::object_members(line, span.clone()) else {
        out.push(invalid("response is not an object"));
        return None;
    };
    let id_span = members.iter().find(|(k, _)| k == "id").map(|(_, r)| r.clone());
    // Ids are echoed byte for byte, so one may hold what serde_json refuses
    // (`1e400`, `"\ud800"`); the rest of the line is the engine's own JSON.
    let body = serde_json::from_str::<Value>(&text).ok().or_else(|| {
        let r = id_span.clone()?;
        let mut bytes = line[span.start..r.start].to_vec();
        bytes.extend_from_slice(b"null");
        bytes.extend_from_slice(&line[r.end..span.end]);
        serde_json::from_slice(&bytes).ok()
    });
    let Some(body) = body else {
        out.push(invalid("response does not parse as plain JSON"));
        return None;
    };
    let Some(id) = id_span.map(|r| String::from_utf8_lossy(&line[r]).into_owned()) else {
        out.push(invalid(if body.get("method").is_some() {
            "notification from the engine (drift alerts are off)"
        } else {
            "response without an id"
        }));
        return None;
    };
    if body.get("jsonrpc") != Some(&Value::from("2.0")) {
        out.push(invalid("jsonrpc is not \"2.0\""));
    }
    match (body.get("result"), body.get("error")) {
        (Some(result), None) => check_result(result, out),
        (None, Some(error)) => check_error(error, &text, out),
        _ => out.push(invalid("a response needs exactly one of result and error")),
    }
    Some(Response { id, body })
}

fn check_error(error: &Value, text: &str, out: &mut Vec<Violation>) {
    let invalid = |why: &str| Violation::new(Invariant::InvalidJsonRpc, format!("{why}: {}", clip(text, 300)));
    let Some(code) = error.get("code").and_then(Value::as_i64) else {
        out.push(invalid("error.code is not an integer"));
        return;
    };
    if !error.get("message").is_some_and(Value::is_string) {
        out.push(invalid("error.message is not a string"));
    }
    let data = error.get("data");
    let data_ok = data.is_some_and(|d| {
        d.get("error_type").is_some_and(Value::is_string)
            && d.get("retryable").is_some_and(Value::is_boolean)
            && d.get("detail").is_some_and(Value::is_string)
    });
    if !data_ok {
        out.push(invalid("error.data lacks error_type, retryable or detail"));
    }
    if code == 3001 || code == -32603 {
        let message = error.get("message").and_then(Value::as_str).unwrap_or("");
        out.push(Violation::new(
            Invariant::InternalError,
            format!("error {code}: {}", clip(message, 300)),
        ));
    }
}

fn check_result(result: &Value, out: &mut Vec<Violation>) {
    let Some(results) = result.get("results").and_then(Value::as_array) else {
        return;
    };
    for (i, r) in results.iter().enumerate() {
        match r.get("score").and_then(Value::as_f64) {
            Some(s) if (0.0..=1.0).contains(&s) => {}
            _ => out.push(Violation::new(
                Invariant::ScoreRange,
                format!(
                    "results[{i}].score is {}",
                    r.get("score").map_or("missing".into(), |s| s.to_string())
                ),
            )),
        }
    }
}

/// Matches the replies of a round to what its lines were owed. `expects`
/// holds one entry per input line. Reports missing, unexpected and
/// out-of-order answers.
pub fn match_round(expects: &[Expect], replies: Vec<Reply>) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut objects = Vec::new();
    let mut arrays = Vec::new();
    for r in replies {
        match r {
            Reply::One(r) => objects.push(r),
            Reply::Batch(rs) => arrays.push(rs),
        }
    }
    // Batches: each array line must answer one batch line exactly.
    let mut open_batches: Vec<&Vec<Slot>> = expects
        .iter()
        .filter_map(|e| match e {
            Expect::Batch(s) => Some(s),
            _ => None,
        })
        .collect();
    let mut leftover_arrays = Vec::new();
    for array in arrays {
        let perfect = open_batches.iter().position(|slots| {
            let mut v = Vec::new();
            assign(&slots.iter().collect::<Vec<_>>(), array.clone(), &mut v);
            v.is_empty()
        });
        match perfect {
            Some(i) => {
                let slots = open_batches.remove(i);
                assign(&slots.iter().collect::<Vec<_>>(), array, &mut out);
            }
            None => leftover_arrays.push(array),
        }
    }
    for array in leftover_arrays {
        if open_batches.is_empty() {
            out.push(Violation::new(
                Invariant::UnexpectedResponse,
                format!("array line of {} responses but no batch was sent", array.len()),
            ));
        } else {
            let slots = open_batches.remove(0);
            assign(&slots.iter().collect::<Vec<_>>(), array, &mut out);
        }
    }
    // A batch left without its array may have been refused whole by one
    // null-id error object; otherwise it owed its members' answers.
    let mut slots: Vec<Slot> = expects
        .iter()
        .filter_map(|e| match e {
            Expect::One(s) => Some(s.clone()),
            _ => None,
        })
        .collect();
    for b in open_batches {
        let owed = b.iter().filter(|s| s.required()).count();
        slots.push(if owed > 0 { Slot::WholeBatch(owed) } else { Slot::MaybeNull });
    }
    assign(&slots.iter().collect::<Vec<_>>(), objects, &mut out);
    out
}

/// Assigns responses to slots, reporting what is left over on either side.
fn assign(slots: &[&Slot], mut responses: Vec<Response>, out: &mut Vec<Violation>) {
    let mut filled = vec![false; slots.len()];
    // 1. Exact ids. A request sent with `"id": null` is answered under id
    // null too, beside the null-id errors owed to invalid members: it takes
    // a null-id answer that is not an error first, so those errors are left
    // for the members that owe them.
    //
    // Lines run concurrently, so requests pipelined under one id may be
    // answered in either order: first each request takes an answer that is
    // provably its own (the same assertion ids, in order), then the rest
    // go by id alone.
    for own_only in [true, false] {
        for (i, slot) in slots.iter().enumerate() {
            let Slot::Id { ids, request, .. } = slot else { continue };
            if filled[i] {
                continue;
            }
            let matches = |r: &Response| ids.iter().any(|id| r.has_id(id));
            let not_null_error = |r: &Response| !(r.id_is_null() && r.is_error());
            let at = if own_only {
                responses
                    .iter()
                    .position(|r| matches(r) && not_null_error(r) && answers_exactly(request.as_ref(), r))
            } else {
                responses
                    .iter()
                    .position(|r| matches(r) && not_null_error(r))
                    .or_else(|| responses.iter().position(matches))
            };
            if let Some(at) = at {
                let r = responses.remove(at);
                check_answer(request.as_ref(), &r, out);
                filled[i] = true;
            }
        }
    }
    // 2. Null-id errors: first where they are owed, then where they may stand in.
    let takes_null: [fn(&Slot) -> bool; 3] = [
        |s| matches!(s, Slot::Null | Slot::WholeBatch(_)),
        |s| matches!(s, Slot::Id { null_ok: true, .. }),
        |s| matches!(s, Slot::MaybeNull),
    ];
    for pass in takes_null {
        for (i, slot) in slots.iter().enumerate() {
            if filled[i] || !pass(slot) {
                continue;
            }
            if let Some(at) = responses.iter().position(|r| r.id_is_null() && r.is_error()) {
                responses.remove(at);
                filled[i] = true;
            }
        }
    }
    for (i, slot) in slots.iter().enumerate() {
        if filled[i] || !slot.required() {
            continue;
        }
        let what = match slot {
            Slot::Id { ids, request, .. } => format!(
                "no response for id {}{}",
                clip(&ids.join(" / "), 200),
                request
                    .as_ref()
                    .map(|r| format!(" (method {})", clip(&r.method, 60)))
                    .unwrap_or_default()
            ),
            Slot::WholeBatch(n) => format!("no array line for a batch owed {n} responses"),
            _ => "no error response (id null) for a line that is not a valid request".to_string(),
        };
        out.push(Violation::new(Invariant::MissingResponse, what));
    }
    for r in responses {
        out.push(Violation::new(
            Invariant::UnexpectedResponse,
            format!("response nobody asked for: {}", r.short()),
        ));
    }
}

/// The assertion ids an `evaluate_batch` request sent, and those its
/// answer's results carry (`None` for other methods and for errors).
fn result_ids<'a>(request: Option<&'a RequestInfo>, r: &Response) -> Option<(&'a Vec<Value>, Vec<Value>)> {
    let Some(RequestInfo {
        method,
        assertion_ids: Some(expected),
    }) = request
    else {
        return None;
    };
    if method != "evaluate_batch" {
        return None;
    }
    let results = r.body.get("result")?.get("results")?.as_array()?;
    let got = results
        .iter()
        .map(|x| x.get("assertion_id").cloned().unwrap_or(Value::Null))
        .collect();
    Some((expected, got))
}

/// Whether `r` carries exactly the results `request` asked for.
fn answers_exactly(request: Option<&RequestInfo>, r: &Response) -> bool {
    result_ids(request, r).is_some_and(|(expected, got)| *expected == got)
}

/// Checks a response against the request it answers.
fn check_answer(request: Option<&RequestInfo>, r: &Response, out: &mut Vec<Violation>) {
    let Some((expected, got)) = result_ids(request, r) else {
        return;
    };
    if got != *expected {
        out.push(Violation::new(
            Invariant::ResultOrder,
            format!(
                "results' assertion_ids {} differ from the request's {}",
                clip(&Value::from(got).to_string(), 300),
                clip(&Value::from(expected.clone()).to_string(), 300)
            ),
        ));
    }
}

/// Cuts `s` to about `max` bytes on a character boundary, saying how much was cut.
pub fn clip(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…(+{} bytes)", &s[..end], s.len() - end)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: usize = 11 << 20;

    fn err(id: &str, code: i64) -> String {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":{code},"message":"m","data":{{"error_type":"X","retryable":false,"detail":"d"}}}}}}"#
        )
    }

    fn ok(id: &str, result: &str) -> String {
        format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{result}}}"#)
    }

    /// Runs the whole check of one round: each input line against the stdout lines.
    fn run(inputs: &[&[u8]], outputs: &[String]) -> Vec<Violation> {
        let expects: Vec<Expect> = inputs.iter().map(|l| expect_line(l, LIMIT)).collect();
        let mut v = Vec::new();
        let replies: Vec<Reply> = outputs.iter().filter_map(|o| check_line(o.as_bytes(), o.len(), &mut v)).collect();
        v.extend(match_round(&expects, replies));
        v
    }

    fn invariants(v: &[Violation]) -> Vec<Invariant> {
        let mut i: Vec<Invariant> = v.iter().map(|x| x.invariant).collect();
        i.sort();
        i
    }

    const LIST: &[u8] = br#"{"jsonrpc":"2.0","id":5,"method":"list_plugins","params":{}}"#;

    #[test]
    fn a_clean_exchange_passes() {
        assert_eq!(run(&[LIST], &[ok("5", "{}")]), vec![]);
        assert_eq!(run(&[b"not json"], &[err("null", -32700)]), vec![]);
        assert_eq!(run(&[b"", b" \t\r"], &[]), vec![]);
        let note = br#"{"jsonrpc":"2.0","method":"list_plugins"}"#;
        assert_eq!(run(&[note], &[]), vec![]);
        // Ids are echoed byte for byte, of any type.
        let odd = br#"{"jsonrpc":"2.0","id":{"a":[1.50]},"method":"x"}"#;
        assert_eq!(run(&[odd], &[err(r#"{"a":[1.50]}"#, -32601)]), vec![]);
        let edge = br#"{"jsonrpc":"2.0","id":"\ud800","method":"x"}"#;
        assert_eq!(run(&[edge], &[err(r#""\ud800""#, -32601)]), vec![]);
    }

    #[test]
    fn flags_an_internal_error() {
        let v = run(&[LIST], &[err("5", 3001)]);
        assert_eq!(invariants(&v), vec![Invariant::InternalError]);
        let v = run(&[LIST], &[err("5", -32603)]);
        assert_eq!(invariants(&v), vec![Invariant::InternalError]);
    }

    #[test]
    fn flags_a_line_over_64_kib() {
        let long = ok("5", &format!("{{\"pad\":\"{}\"}}", "x".repeat(MAX_RESPONSE_LINE)));
        let v = run(&[LIST], &[long]);
        assert_eq!(invariants(&v), vec![Invariant::LineTooLong]);
        // A line cut short while reading still counts at its full length.
        let mut v = Vec::new();
        assert!(check_line(b"{\"jsonrpc\"", MAX_RESPONSE_LINE + 1, &mut v).is_none());
        assert_eq!(invariants(&v), vec![Invariant::LineTooLong]);
    }

    #[test]
    fn flags_a_missing_response() {
        assert_eq!(invariants(&run(&[LIST], &[])), vec![Invariant::MissingResponse]);
        // Whitespace JSON does not know is not a blank line: it owes a parse error.
        assert_eq!(invariants(&run(&[b"\x0b\x0c"], &[])), vec![Invariant::MissingResponse]);
        // A batch owes its array line.
        let batch = br#"[{"jsonrpc":"2.0","id":1,"method":"a"},{"jsonrpc":"2.0","id":2,"method":"b"}]"#;
        let v = run(&[batch], &[format!("[{}]", err("1", -32601))]);
        assert_eq!(invariants(&v), vec![Invariant::MissingResponse]);
    }

    #[test]
    fn flags_an_answer_nobody_asked_for() {
        let note = br#"{"jsonrpc":"2.0","method":"list_plugins"}"#;
        assert_eq!(invariants(&run(&[note], &[ok("null", "{}")])), vec![Invariant::UnexpectedResponse]);
        assert_eq!(
            invariants(&run(&[b"  "], &[err("null", -32700)])),
            vec![Invariant::UnexpectedResponse]
        );
        assert_eq!(
            invariants(&run(&[LIST], &[ok("5", "{}"), ok("5", "{}")])),
            vec![Invariant::UnexpectedResponse]
        );
    }

    #[test]
    fn a_null_id_request_beside_an_invalid_member_is_matched_to_its_answer() {
        // The invalid member owes a null-id error; the request sent with id
        // null gets its own answer under id null, whichever comes first.
        let batch = br#"[{"foo":"bar"},{"jsonrpc":"2.0","id":null,"method":"list_plugins","params":{}}]"#;
        let answers = format!("[{},{}]", err("null", -32600), ok("null", "{}"));
        assert_eq!(run(&[batch], &[answers]), vec![]);
        let reversed = format!("[{},{}]", ok("null", "{}"), err("null", -32600));
        assert_eq!(run(&[batch], &[reversed]), vec![]);
        // Two null-id errors also fit: the request may fail on its own.
        let both_errors = format!("[{},{}]", err("null", -32600), err("null", -32601));
        assert_eq!(run(&[batch], &[both_errors]), vec![]);
    }

    #[test]
    fn flags_a_batch_member_array_that_was_executed() {
        // A positional array is not a request object: -32600 under id null, never run.
        let batch = br#"[["2.0",7,"list_plugins",{}]]"#;
        assert_eq!(run(&[batch], &[format!("[{}]", err("null", -32600))]), vec![]);
        let v = run(&[batch], &[format!("[{}]", ok("7", "{}"))]);
        assert_eq!(invariants(&v), vec![Invariant::MissingResponse, Invariant::UnexpectedResponse]);
        // Refusing the whole batch with one error is acceptable.
        assert_eq!(run(&[batch], &[err("null", -32600)]), vec![]);
    }

    #[test]
    fn flags_results_out_of_request_order() {
        let req = br#"{"jsonrpc":"2.0","id":9,"method":"evaluate_batch","params":{"trace":{},"assertions":[{"assertion_id":"a"},{"assertion_id":"b"}]}}"#;
        let result = |x: &str, y: &str| {
            ok(
                "9",
                &format!(r#"{{"results":[{{"assertion_id":"{x}","score":1}},{{"assertion_id":"{y}","score":0}}],"total_cost":0}}"#),
            )
        };
        assert_eq!(run(&[req], &[result("a", "b")]), vec![]);
        assert_eq!(invariants(&run(&[req], &[result("b", "a")])), vec![Invariant::ResultOrder]);
    }

    #[test]
    fn pipelined_requests_under_one_id_may_be_answered_in_either_order() {
        let req = |a: &str| {
            format!(
                r#"{{"jsonrpc":"2.0","id":4,"method":"evaluate_batch","params":{{"trace":{{}},"assertions":[{{"assertion_id":"{a}"}}]}}}}"#
            )
        };
        let answer = |a: &str| {
            ok(
                "4",
                &format!(r#"{{"results":[{{"assertion_id":"{a}","score":1}}],"total_cost":0}}"#),
            )
        };
        let (first, second) = (req("a"), req("b"));
        let lines = [first.as_bytes(), second.as_bytes()];
        assert_eq!(run(&lines, &[answer("b"), answer("a")]), vec![]);
        // An error answer (one request refused) fits no results check,
        // so it must not take the other request's answer from it.
        let refused = err("4", -32602);
        assert_eq!(run(&lines, &[refused.clone(), answer("b")]), vec![]);
        assert_eq!(run(&lines, &[answer("b"), refused]), vec![]);
        // Still flagged when neither answer fits its request.
        assert_eq!(invariants(&run(&lines, &[answer("c"), answer("a")])), vec![Invariant::ResultOrder]);
    }

    #[test]
    fn flags_scores_outside_zero_to_one() {
        for score in ["1.5", "-0.1", "\"0.5\"", "null"] {
            let line = ok("5", &format!(r#"{{"results":[{{"assertion_id":"a","score":{score}}}]}}"#));
            assert_eq!(invariants(&run(&[LIST], &[line])), vec![Invariant::ScoreRange], "{score}");
        }
    }

    #[test]
    fn flags_lines_that_are_not_json_rpc() {
        for bad in [
            r#"{"id":1,"result":{}}"#,
            r#"{"jsonrpc":"2.0","id":5}"#,
            "hello",
            r#"{"jsonrpc":"2.0","id":5,"error":{"code":1}}"#,
        ] {
            let v = run(&[LIST], &[bad.to_string()]);
            assert!(v.iter().any(|x| x.invariant == Invariant::InvalidJsonRpc), "{bad}: {v:?}");
        }
    }

    #[test]
    fn edgy_requests_may_be_refused_with_a_parse_error() {
        let req = br#"{"jsonrpc":"2.0","id":3,"method":"evaluate_batch","params":{"x":1e400}}"#;
        assert_eq!(run(&[req], &[err("null", -32700)]), vec![]);
        assert_eq!(run(&[req], &[err("3", 1002)]), vec![]);
        // But a plain request must keep its id.
        assert_eq!(
            invariants(&run(&[LIST], &[err("null", -32600)])),
            vec![Invariant::MissingResponse, Invariant::UnexpectedResponse]
        );
    }

    #[test]
    fn oversized_lines_owe_one_error() {
        let mut line = br#"{"jsonrpc":"2.0","id":42,"method":"evaluate_batch","params":{"pad":""#.to_vec();
        line.resize(LIMIT + 10, b'q');
        assert_eq!(expect_line(&line, LIMIT).required_lines(), 1);
        assert_eq!(run(&[&line], &[err("42", 1001)]), vec![]);
    }
}
