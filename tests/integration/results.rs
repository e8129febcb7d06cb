//! Result fields through the real binary: `layer`, `type`, `expected`,
//! `actual`, `trace_node_path`, `suggested_action` and `threshold_source` on
//! every layer; the judge's audit trail (`judge_metadata`: samples, variance,
//! prompt hash, bias probes, a persisted calibration) against a fake
//! OpenAI-compatible judge on loopback; the `calibrate` command; and paid
//! layers refused at planning when no provider is configured.

use crate::common::*;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

/// A fake provider on loopback, kept alive by its own runtime.
struct Fake {
    rt: tokio::runtime::Runtime,
    server: MockServer,
}

impl Fake {
    fn start(judge: impl Respond + 'static) -> Fake {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let server = rt.block_on(MockServer::start());
        rt.block_on(
            Mock::given(method("POST"))
                .and(path("/v1/chat/completions"))
                .respond_with(judge)
                .mount(&server),
        );
        rt.block_on(
            Mock::given(method("POST"))
                .and(path("/v1/embeddings"))
                .respond_with(Embeddings)
                .mount(&server),
        );
        Fake { rt, server }
    }

    fn v1(&self) -> String {
        format!("{}/v1", self.server.uri())
    }

    fn judge_requests(&self) -> Vec<Value> {
        self.rt
            .block_on(self.server.received_requests())
            .unwrap_or_default()
            .into_iter()
            .filter(|r| r.url.path() == "/v1/chat/completions")
            .map(|r| serde_json::from_slice(&r.body).unwrap())
            .collect()
    }
}

fn message(body: &Value, role: &str) -> String {
    body["messages"].as_array().unwrap().iter().find(|m| m["role"] == role).unwrap()["content"]
        .as_str()
        .unwrap()
        .to_owned()
}

fn reply(body: &Value, score: f64) -> ResponseTemplate {
    let text = crate::common::fake_provider::verdict(
        body,
        &format!("{{\"score\": {score}, \"explanation\": \"the refund id is missing\"}}"),
    );
    ResponseTemplate::new(200).set_body_json(json!({
        "choices": [{"message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 1000, "completion_tokens": 100}
    }))
}

/// Scores by what the request shows, so each probe has its own score:
/// output padded with filler 0.8, output labelled as the judge's own 0.95,
/// output shown before the user input 0.4, otherwise 0.6.
struct ProbeAwareJudge;

impl Respond for ProbeAwareJudge {
    fn respond(&self, req: &Request) -> ResponseTemplate {
        let body: Value = serde_json::from_slice(&req.body).unwrap();
        let user = message(&body, "user");
        let score = if user.contains("To restate the above") {
            0.8
        } else if user.contains("the model performing this evaluation") {
            0.95
        } else if user.find("<<<AGENT_OUTPUT_START>>>") < user.find("<<<USER_INPUT_START>>>") {
            0.4
        } else {
            0.6
        };
        reply(&body, score)
    }
}

/// Answers 0.9, 0.3, 0.6, 0.9, … in call order.
struct CyclingJudge(Arc<AtomicUsize>);

impl Respond for CyclingJudge {
    fn respond(&self, req: &Request) -> ResponseTemplate {
        let body: Value = serde_json::from_slice(&req.body).unwrap();
        let n = self.0.fetch_add(1, Ordering::SeqCst);
        reply(&body, [0.9, 0.3, 0.6][n % 3])
    }
}

/// Scores a labelled record's text: `good` 0.9, `bad` 0.1, else 0.5.
struct LabelJudge;

impl Respond for LabelJudge {
    fn respond(&self, req: &Request) -> ResponseTemplate {
        let body: Value = serde_json::from_slice(&req.body).unwrap();
        let user = message(&body, "user");
        reply(
            &body,
            if user.contains("good") {
                0.9
            } else if user.contains("bad") {
                0.1
            } else {
                0.5
            },
        )
    }
}

/// [`LabelJudge`], answering each call after `delay`, and noting when each
/// call arrived.
struct SlowLabelJudge {
    delay: std::time::Duration,
    arrivals: Arc<std::sync::Mutex<Vec<std::time::Instant>>>,
}

impl Respond for SlowLabelJudge {
    fn respond(&self, req: &Request) -> ResponseTemplate {
        self.arrivals.lock().unwrap().push(std::time::Instant::now());
        LabelJudge.respond(req).set_delay(self.delay)
    }
}

struct Embeddings;

impl Respond for Embeddings {
    fn respond(&self, req: &Request) -> ResponseTemplate {
        let body: Value = serde_json::from_slice(&req.body).unwrap();
        // The target and the reference point in different directions: similarity 0.
        let data: Vec<Value> = body["input"]
            .as_array()
            .unwrap()
            .iter()
            .enumerate()
            .map(|(i, _)| json!({"index": i, "embedding": if i == 0 { [1.0, 0.0] } else { [0.0, 1.0] }}))
            .collect();
        ResponseTemplate::new(200).set_body_json(json!({"data": data, "usage": {"prompt_tokens": 10}}))
    }
}

fn engine_for(fake: &Fake, cache: &std::path::Path, extra: &[(&str, &str)]) -> Engine {
    let v1 = fake.v1();
    let mut env = vec![
        ("ATTEST_JUDGE_BASE_URL", v1.as_str()),
        ("ATTEST_EMBEDDING_BASE_URL", v1.as_str()),
        ("ATTEST_CACHE_DIR", cache.to_str().unwrap()),
    ];
    env.extend_from_slice(extra);
    let mut e = Engine::spawn_env(&["--log-level=warn"], Stderr::Drain, &env);
    e.initialize();
    e
}

fn results(resp: &Value) -> Vec<Value> {
    resp["result"]["results"]
        .as_array()
        .unwrap_or_else(|| panic!("no results: {resp}"))
        .clone()
}

fn by_id<'a>(results: &'a [Value], id: &str) -> &'a Value {
    results
        .iter()
        .find(|r| r["assertion_id"] == id)
        .unwrap_or_else(|| panic!("no {id}"))
}

fn text<'a>(r: &'a Value, field: &str) -> &'a str {
    r[field].as_str().unwrap_or_else(|| panic!("{field} missing: {r}"))
}

#[test]
fn every_free_layer_says_what_it_expected_and_found() {
    let mut e = Engine::spawn();
    e.initialize();
    let mut trace = refund_trace();
    // process_refund before lookup_order.
    let steps = trace["steps"].as_array_mut().unwrap();
    steps.swap(1, 2);
    trace["output"]["structured"]["confidence"] = json!(1.7);
    let assertions = json!([
        {"assertion_id": "schema", "type": "schema", "spec": {"target": "output.structured", "schema": {"type": "object", "properties": {"confidence": {"type": "number", "maximum": 1}}}}},
        {"assertion_id": "cost", "type": "constraint", "spec": {"field": "metadata.cost_usd", "operator": "lte", "value": 0.005}},
        {"assertion_id": "order", "type": "trace", "spec": {"check": "contains_in_order", "tools": ["lookup_order", "process_refund"]}},
        {"assertion_id": "apology", "type": "content", "spec": {"target": "output.message", "check": "contains", "value": "refund ID: RFD-002"}},
        {"assertion_id": "ok", "type": "content", "spec": {"target": "output.message", "check": "contains", "value": "refund"}},
        {"assertion_id": "tree", "type": "trace_tree", "spec": {"check": "agent_called", "agent_id": "billing"}}
    ]);
    let resp = e.request(&evaluate_request(json!(1), trace, assertions));
    let rs = results(&resp);

    let schema = by_id(&rs, "schema");
    assert_eq!((schema["layer"].as_u64(), text(schema, "type")), (Some(1), "schema"));
    assert!(text(schema, "expected").starts_with("maximum: 1"), "{schema}");
    assert_eq!(text(schema, "actual"), "output.structured.confidence = 1.7");
    assert_eq!(text(schema, "trace_node_path"), "output.structured.confidence");
    assert!(text(schema, "suggested_action").contains("`maximum`"), "{schema}");

    let cost = by_id(&rs, "cost");
    assert_eq!((cost["layer"].as_u64(), text(cost, "type")), (Some(2), "constraint"));
    assert_eq!(text(cost, "expected"), "metadata.cost_usd lte 0.005");
    assert_eq!(text(cost, "actual"), "metadata.cost_usd = 0.0067");
    assert_eq!(text(cost, "trace_node_path"), "metadata.cost_usd");
    assert!(text(cost, "suggested_action").contains("bring it down (by 0.0017)"), "{cost}");

    let order = by_id(&rs, "order");
    assert_eq!((order["layer"].as_u64(), text(order, "type")), (Some(3), "trace"));
    assert_eq!(text(order, "expected"), "contains_in_order: lookup_order → process_refund");
    assert_eq!(text(order, "actual"), "tool calls: process_refund → lookup_order");
    // The step that ran too early.
    assert_eq!(text(order, "trace_node_path"), "steps[1]");
    assert_eq!(
        text(order, "suggested_action"),
        "`process_refund` ran before `lookup_order`: make the agent call `lookup_order` first, or relax the check to `required_tools`."
    );

    let apology = by_id(&rs, "apology");
    assert_eq!((apology["layer"].as_u64(), text(apology, "type")), (Some(4), "content"));
    assert_eq!(text(apology, "expected"), "contains 'refund ID: RFD-002'");
    // The excerpt sits around the closest match, "refund id: rfd-00".
    assert!(text(apology, "actual").contains("Refund ID: RFD-001"), "{apology}");
    assert_eq!(text(apology, "trace_node_path"), "output.message");

    let ok = by_id(&rs, "ok");
    assert_eq!(
        (ok["layer"].as_u64(), text(ok, "type"), &ok["status"]),
        (Some(4), "content", &json!("pass"))
    );
    for field in [
        "expected",
        "actual",
        "suggested_action",
        "trace_node_path",
        "threshold_source",
        "judge_metadata",
    ] {
        assert!(ok.get(field).is_none(), "a pass carries no {field}: {ok}");
    }

    let tree = by_id(&rs, "tree");
    assert_eq!((tree["layer"].as_u64(), text(tree, "type")), (Some(7), "trace_tree"));
    assert_eq!(text(tree, "expected"), "agent `billing` called somewhere in the tree");
    assert_eq!(text(tree, "actual"), "tree: customer-service-agent (depth 0)");
    assert_eq!(text(tree, "trace_node_path"), "customer-service-agent");
}

#[test]
fn trace_tree_evidence_names_the_agent_path() {
    let mut e = Engine::spawn();
    e.initialize();
    let writer = json!({"schema_version": 1, "trace_id": "w", "agent_id": "writer", "parent_trace_id": "r",
        "output": {"draft": "Paris."}, "steps": [{"type": "tool_call", "name": "format", "started_at_ms": 55, "ended_at_ms": 90}]});
    let researcher = json!({"schema_version": 1, "trace_id": "r", "agent_id": "researcher", "parent_trace_id": "root",
        "output": {"summary": "Paris"}, "steps": [{"type": "agent_call", "name": "writer", "sub_trace": writer}]});
    let trace = json!({"schema_version": 1, "trace_id": "root", "agent_id": "orchestrator", "output": {"message": "done"},
        "steps": [{"type": "agent_call", "name": "researcher", "sub_trace": researcher}]});
    let assertions = json!([
        {"assertion_id": "depth", "type": "trace_tree", "spec": {"check": "delegation_depth", "max_depth": 1}},
        {"assertion_id": "says", "type": "trace_tree", "spec": {"check": "agent_output_contains", "agent_id": "writer", "value": "Lyon"}}
    ]);
    let rs = results(&e.request(&evaluate_request(json!(1), trace, assertions)));
    let depth = by_id(&rs, "depth");
    assert_eq!(text(depth, "expected"), "delegation depth ≤ 1");
    assert_eq!(text(depth, "actual"), "depth 2 at orchestrator > researcher > writer");
    assert_eq!(text(depth, "trace_node_path"), "orchestrator > researcher > writer");
    let says = by_id(&rs, "says");
    assert_eq!(text(says, "trace_node_path"), "orchestrator > researcher > writer > output");
    assert_eq!(text(says, "actual"), "output: {\"draft\":\"Paris.\"}");
}

#[test]
fn paid_layers_without_a_provider_are_refused_before_anything_runs() {
    let mut e = Engine::spawn();
    e.initialize();
    let assertions = json!([
        {"assertion_id": "cost", "type": "constraint", "spec": {"field": "metadata.cost_usd", "operator": "lte", "value": 1}},
        {"assertion_id": "judge", "type": "llm_judge", "spec": {"rubric": "helpfulness"}}
    ]);
    let err = expect_error(&e.request(&evaluate_request(json!(1), refund_trace(), assertions)), 2001);
    assert_eq!(err["data"]["retryable"], json!(false), "{err}");
    assert_eq!(err["data"]["field"], json!("params.assertions[1]"), "{err}");
    assert!(err["data"]["detail"].as_str().unwrap().contains("ATTEST_JUDGE_BASE_URL"), "{err}");

    let assertions = json!([{"assertion_id": "sim", "type": "embedding", "spec": {"reference": "refund processed"}}]);
    let err = expect_error(&e.request(&evaluate_request(json!(2), refund_trace(), assertions)), 2001);
    assert_eq!(err["data"]["retryable"], json!(false), "{err}");
    assert!(
        err["data"]["detail"].as_str().unwrap().contains("ATTEST_EMBEDDING_BASE_URL"),
        "{err}"
    );
}

#[test]
fn embedding_results_carry_threshold_and_score() {
    let fake = Fake::start(ProbeAwareJudge);
    let cache = tempfile::tempdir().unwrap();
    let mut e = engine_for(&fake, cache.path(), &[]);
    let assertions = json!([{"assertion_id": "sim", "type": "embedding", "spec": {"reference": "refund processed", "threshold": 0.8}}]);
    let rs = results(&e.request(&evaluate_request(json!(1), refund_trace(), assertions)));
    let sim = by_id(&rs, "sim");
    assert_eq!((sim["layer"].as_u64(), text(sim, "type")), (Some(5), "embedding"));
    assert_eq!(text(sim, "threshold_source"), "static");
    assert!(text(sim, "expected").starts_with("cosine similarity ≥ 0.8"), "{sim}");
    assert!(text(sim, "actual").contains("(similarity 0.0000, "), "{sim}");
    assert!(text(sim, "actual").starts_with('\''), "the agent's text comes first: {sim}");
    assert!(text(sim, "suggested_action").contains("spec.reference"), "{sim}");
}

#[test]
fn judge_metadata_reports_samples_and_variance() {
    let fake = Fake::start(CyclingJudge(Arc::new(AtomicUsize::new(0))));
    let cache = tempfile::tempdir().unwrap();
    let mut e = engine_for(&fake, cache.path(), &[]);
    let assertions = json!([{"assertion_id": "j", "type": "llm_judge", "spec": {"rubric": "helpfulness", "criteria": "gives the refund id", "samples": 3, "threshold": 0.8}}]);
    let rs = results(&e.request(&evaluate_request(json!(1), refund_trace(), assertions)));
    let j = by_id(&rs, "j");
    assert_eq!((j["layer"].as_u64(), text(j, "type")), (Some(6), "llm_judge"));
    assert_eq!(j["status"], "hard_fail");
    let meta = &j["judge_metadata"];
    assert_eq!(meta["model"], "gpt-4.1");
    assert_eq!(meta["rubric_name"], "helpfulness");
    assert_eq!(meta["rubric_version"], "2026-11.1");
    let mut samples: Vec<f64> = meta["sample_scores"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_f64().unwrap())
        .collect();
    samples.sort_by(f64::total_cmp);
    assert_eq!(samples, vec![0.3, 0.6, 0.9]);
    assert!((meta["score_mean"].as_f64().unwrap() - 0.6).abs() < 1e-12, "{meta}");
    assert!((meta["score_stddev"].as_f64().unwrap() - 0.06f64.sqrt()).abs() < 1e-12, "{meta}");
    assert_eq!(meta["high_variance"], json!(true));
    assert_eq!(j["score"], json!(0.6));
    assert_eq!(text(j, "expected"), "judged score ≥ 0.8 (helpfulness)");
    assert!(text(j, "actual").starts_with("score 0.60: "), "{j}");
    assert!(text(j, "suggested_action").contains("lower spec.threshold to 0.60"), "{j}");

    // The hash covers the system message as sent, less the verdict contract
    // whose nonce changes with every call, then the criteria.
    let sent = fake.judge_requests();
    let sent_system = message(&sent[0], "system");
    let system = sent_system.split("\n\nYour verdict is one JSON object").next().unwrap();
    assert_ne!(system, sent_system, "the contract was sent");
    let expected = attest_calibration::prompt_hash(&format!("{system}\nEvaluation criteria: gives the refund id"));
    assert_eq!(meta["prompt_hash"], json!(expected));
}

#[test]
fn each_bias_probe_reports_its_score_and_delta() {
    let fake = Fake::start(ProbeAwareJudge);
    let cache = tempfile::tempdir().unwrap();
    let mut e = engine_for(&fake, cache.path(), &[]);
    let assertions = json!([{"assertion_id": "j", "type": "llm_judge",
        "spec": {"rubric": "helpfulness", "bias_probes": ["verbosity", "position", "self_preference"]}}]);
    let rs = results(&e.request(&evaluate_request(json!(1), refund_trace(), assertions)));
    let meta = &by_id(&rs, "j")["judge_metadata"];
    assert_eq!(by_id(&rs, "j")["score"], json!(0.6));
    let probes = meta["bias_probes"].as_array().unwrap();
    let got: Vec<(String, f64, f64)> = probes
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_owned(),
                p["score"].as_f64().unwrap(),
                p["delta"].as_f64().unwrap(),
            )
        })
        .collect();
    let want = [("verbosity", 0.8), ("position", 0.4), ("self_preference", 0.95)];
    assert_eq!(got.len(), 3, "{meta}");
    for ((name, score, delta), (wname, wscore)) in got.iter().zip(want) {
        assert_eq!(name, wname);
        assert_eq!(*score, wscore);
        assert!((delta - (wscore - 0.6)).abs() < 1e-12, "{name}: {delta}");
    }
    // One call each, and each probe's cost is accounted (4 x $0.0028).
    assert_eq!(fake.judge_requests().len(), 4);
    assert!((by_id(&rs, "j")["cost"].as_f64().unwrap() - 4.0 * 0.0028).abs() < 1e-9);

    // Config turns the probes on for assertions that name none; a repeat is
    // served from the cache (no new calls).
    let mut e2 = engine_for(&fake, cache.path(), &[("ATTEST_JUDGE_BIAS_PROBES", "position")]);
    let assertions = json!([{"assertion_id": "j", "type": "llm_judge", "spec": {"rubric": "helpfulness"}}]);
    let rs = results(&e2.request(&evaluate_request(json!(1), refund_trace(), assertions)));
    let probes = by_id(&rs, "j")["judge_metadata"]["bias_probes"].as_array().unwrap().clone();
    assert_eq!(probes.len(), 1);
    assert_eq!(probes[0]["name"], "position");
    assert_eq!(fake.judge_requests().len(), 4);
    assert_eq!(by_id(&rs, "j")["cost"], json!(0.0));
}

#[test]
fn a_persisted_calibration_appears_on_later_judge_results() {
    let fake = Fake::start(LabelJudge);
    let cache = tempfile::tempdir().unwrap();
    let labels = cache.path().join("labels.jsonl");
    let rows = [
        ("good answer", 1.0),
        ("bad answer", 0.0),
        ("good reply", 1.0),
        ("bad reply", 1.0),
        ("meh", 0.0),
    ];
    let text_rows: Vec<String> = rows
        .iter()
        .map(|(input, label)| json!({"input": input, "human_label": label}).to_string())
        .collect();
    std::fs::write(&labels, text_rows.join("\n")).unwrap();
    let calibrate = |extra: &[&str], labels: &std::path::Path| {
        command()
            .args([
                "--log-level=warn",
                "calibrate",
                "--labels",
                labels.to_str().unwrap(),
                "--rubric",
                "helpfulness",
            ])
            .args(extra)
            .env("ATTEST_JUDGE_BASE_URL", fake.v1())
            .env("ATTEST_CACHE_DIR", cache.path())
            .output()
            .unwrap()
    };
    let out = calibrate(&["--persist", "--format", "json"], &labels);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    // Judge scores 0.9, 0.1, 0.9, 0.1, 0.5 against labels 1, 0, 1, 1, 0.
    let pairs: Vec<attest_calibration::LabelPair> = [(1.0, 0.9), (0.0, 0.1), (1.0, 0.9), (1.0, 0.1), (0.0, 0.5)]
        .iter()
        .map(|&(human, judge)| attest_calibration::LabelPair { human, judge })
        .collect();
    let want = attest_calibration::compute_agreement(&pairs, 0.5).unwrap();
    assert_eq!(report["label_count"], json!(5));
    assert_eq!(report["agreement"].as_f64().unwrap(), want.agreement);
    assert_eq!(report["cohen_kappa"].as_f64().unwrap(), want.cohen_kappa);
    assert_eq!(report["persisted"], json!(true));
    assert_eq!(report["rubric_version"], json!("2026-11.1"));

    let mut e = engine_for(&fake, cache.path(), &[]);
    let assertions = json!([
        {"assertion_id": "same", "type": "llm_judge", "spec": {"rubric": "helpfulness"}},
        {"assertion_id": "other_prompt", "type": "llm_judge", "spec": {"rubric": "helpfulness", "criteria": "mentions the refund id"}}
    ]);
    let rs = results(&e.request(&evaluate_request(json!(1), refund_trace(), assertions)));
    let same = &by_id(&rs, "same")["judge_metadata"];
    assert_eq!(same["prompt_hash"], report["prompt_hash"]);
    assert_eq!(same["calibration"]["label_count"], json!(5));
    assert_eq!(same["calibration"]["agreement"].as_f64().unwrap(), want.agreement);
    assert_eq!(same["calibration"]["cohen_kappa"].as_f64().unwrap(), want.cohen_kappa);
    let other = &by_id(&rs, "other_prompt")["judge_metadata"];
    assert_ne!(other["prompt_hash"], report["prompt_hash"]);
    assert!(other.get("calibration").is_none(), "a changed prompt no longer matches: {other}");

    // The SDK's passes_judge always sends criteria: calibrated with the same
    // --criteria, such assertions carry the calibration too.
    let out = calibrate(&["--criteria", "mentions the refund id", "--persist", "--format", "json"], &labels);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let with_criteria: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(with_criteria["prompt_hash"], other["prompt_hash"]);
    assert_eq!(with_criteria["criteria"], json!("mentions the refund id"));
    let assertions = json!([{"assertion_id": "sdk_shaped", "type": "llm_judge",
        "spec": {"target": "output.message", "criteria": "mentions the refund id", "rubric": "helpfulness", "threshold": 0.8, "model": null, "soft": false}}]);
    let rs = results(&e.request(&evaluate_request(json!(2), refund_trace(), assertions)));
    assert_eq!(by_id(&rs, "sdk_shaped")["judge_metadata"]["calibration"]["label_count"], json!(5));

    // Both classes present and every pair ranked backwards: ROC-AUC is 0, not undefined.
    let backwards = cache.path().join("backwards.jsonl");
    std::fs::write(
        &backwards,
        "{\"input\": \"good answer\", \"human_label\": 0}\n{\"input\": \"bad answer\", \"human_label\": 1}\n",
    )
    .unwrap();
    let table = String::from_utf8(calibrate(&[], &backwards).stdout).unwrap();
    assert!(table.contains("roc auc       0.000"), "{table}");
    let one_class = cache.path().join("one_class.jsonl");
    std::fs::write(&one_class, "{\"input\": \"good answer\", \"human_label\": 1}\n").unwrap();
    let table = String::from_utf8(calibrate(&[], &one_class).stdout).unwrap();
    assert!(table.contains("n/a (one human class)"), "{table}");
}

/// Records are judged as many at once as the provider takes, and still
/// paired with their labels in file order.
#[test]
fn calibrate_judges_records_concurrently_in_file_order() {
    let arrivals = Arc::new(std::sync::Mutex::new(Vec::new()));
    let delay = std::time::Duration::from_secs(2);
    let fake = Fake::start(SlowLabelJudge {
        delay,
        arrivals: arrivals.clone(),
    });
    let dir = tempfile::tempdir().unwrap();
    let labels = dir.path().join("labels.jsonl");
    // Every good record labelled 1 and every bad one 0: perfect agreement
    // only when each score meets its own record.
    let rows: Vec<String> = (0..8)
        .map(|i| {
            let (text, label) = if i % 2 == 0 { ("good", 1) } else { ("bad", 0) };
            json!({"input": format!("{text} answer {i}"), "human_label": label}).to_string()
        })
        .collect();
    std::fs::write(&labels, rows.join("\n")).unwrap();
    let out = command()
        .args(["calibrate", "--labels", labels.to_str().unwrap(), "--format", "json"])
        .env("ATTEST_JUDGE_BASE_URL", fake.v1())
        .env("ATTEST_CACHE_DIR", dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["label_count"], json!(8));
    assert_eq!(report["agreement"], json!(1.0), "{report}");
    // One at a time, each call would arrive a whole delay after the one before.
    let arrivals = arrivals.lock().unwrap();
    assert_eq!(arrivals.len(), 8);
    let together = arrivals.iter().filter(|t| t.duration_since(arrivals[0]) < delay / 2).count();
    assert!(together >= 4, "only {together} of 8 calls were in flight together");
}

/// A budget stops calibration about where one call at a time would, though
/// calls otherwise run together.
#[test]
fn calibrate_stops_at_the_budget() {
    let fake = Fake::start(LabelJudge);
    let dir = tempfile::tempdir().unwrap();
    let labels = dir.path().join("labels.jsonl");
    let rows: Vec<String> = (0..8)
        .map(|i| json!({"input": format!("good {i}"), "human_label": 1}).to_string())
        .collect();
    std::fs::write(&labels, rows.join("\n")).unwrap();
    // Each call: 1,000 tokens in and 100 out at $10 per million, $0.011.
    let config = dir.path().join("attest.toml");
    std::fs::write(
        &config,
        "budget_usd = 0.02\n[prices.\"gpt-4.1\"]\ninput_per_mtok = 10.0\noutput_per_mtok = 10.0\n",
    )
    .unwrap();
    let out = command()
        .arg("--config")
        .arg(&config)
        .args(["calibrate", "--labels", labels.to_str().unwrap()])
        .env("ATTEST_JUDGE_BASE_URL", fake.v1())
        .env("ATTEST_CACHE_DIR", dir.path())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains("stopped after 2 of 8 records") && said.contains("budget_usd"),
        "{said}"
    );
    assert_eq!(fake.judge_requests().len(), 2, "no call started past the budget");
}

#[test]
fn calibrate_explains_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let labels = dir.path().join("labels.csv");
    std::fs::write(&labels, "input,human_label\nhello,1\n").unwrap();
    // No judge configured.
    let out = run(&["calibrate", "--labels", labels.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("ATTEST_JUDGE_BASE_URL"));
    let out = run(&["calibrate", "--labels", labels.to_str().unwrap(), "--threshold", "1.5"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--threshold"));
    let out = run(&["calibrate", "--labels", dir.path().join("none.csv").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
}
