//! Mapping spans onto Attest traces (protocol §3). Two conventions are read:
//! the OpenTelemetry GenAI semantic conventions (current attribute names and
//! the older ones used up to 1.36) and OpenInference. The table in
//! docs/continuous.md is the reference for every attribute used here.

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::frameworks::Framework;
use crate::otlp::Span;

/// What a span is, once its convention is recognised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanRole {
    Llm,
    Tool,
    Retrieval,
    Agent,
    /// Recognised convention, no step of its own (chain, embedding, ...): its children are walked.
    Passthrough,
    /// No known convention.
    Unknown,
}

/// Which convention a span was read with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Convention {
    GenAi,
    OpenInference,
    /// OpenLLMetry (`traceloop.span.kind`, `traceloop.entity.*`); its LLM
    /// spans are GenAI spans.
    Traceloop,
    /// MLflow tracing (`mlflow.spanType`, `mlflow.spanInputs`/`mlflow.spanOutputs`).
    MlFlow,
}

pub fn classify(span: &Span) -> (SpanRole, Option<Convention>) {
    if let Some(kind) = span.attr_str("openinference.span.kind") {
        let role = match kind.to_ascii_uppercase().as_str() {
            "LLM" => SpanRole::Llm,
            "TOOL" => SpanRole::Tool,
            "RETRIEVER" => SpanRole::Retrieval,
            "AGENT" => SpanRole::Agent,
            _ => SpanRole::Passthrough,
        };
        return (role, Some(Convention::OpenInference));
    }
    // OpenLLMetry (Traceloop): workflows and tasks hold the steps.
    if let Some(kind) = span.attr_str("traceloop.span.kind") {
        let role = match kind {
            "agent" => SpanRole::Agent,
            "tool" => SpanRole::Tool,
            _ => SpanRole::Passthrough,
        };
        return (role, Some(Convention::Traceloop));
    }
    // MLflow tracing.
    if let Some(kind) = span.attr_str("mlflow.spanType") {
        let role = match kind.to_ascii_uppercase().as_str() {
            "LLM" | "CHAT_MODEL" => SpanRole::Llm,
            "TOOL" => SpanRole::Tool,
            "RETRIEVER" => SpanRole::Retrieval,
            "AGENT" => SpanRole::Agent,
            _ => SpanRole::Passthrough,
        };
        return (role, Some(Convention::MlFlow));
    }
    if let Some(op) = span.attr_str("gen_ai.operation.name") {
        let role = match op {
            "chat" | "text_completion" | "generate_content" | "completion" => SpanRole::Llm,
            "execute_tool" => SpanRole::Tool,
            "invoke_agent" => SpanRole::Agent,
            _ => SpanRole::Passthrough,
        };
        return (role, Some(Convention::GenAi));
    }
    // Older GenAI instrumentations set no operation name.
    if span.attributes.contains_key("gen_ai.tool.name") {
        return (SpanRole::Tool, Some(Convention::GenAi));
    }
    if span.attributes.contains_key("gen_ai.system") || span.attributes.contains_key("gen_ai.provider.name") {
        let role = if span.attributes.contains_key("gen_ai.request.model") {
            SpanRole::Llm
        } else {
            SpanRole::Passthrough
        };
        return (role, Some(Convention::GenAi));
    }
    if span.attributes.contains_key("gen_ai.agent.name") {
        return (SpanRole::Agent, Some(Convention::GenAi));
    }
    (SpanRole::Unknown, None)
}

/// Per-model prices in USD per million tokens, used to fill `cost_usd`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PriceTable {
    pub models: HashMap<String, ModelPrice>,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelPrice {
    pub input_per_million: f64,
    pub output_per_million: f64,
}

impl PriceTable {
    /// Exact model name first, else the longest configured prefix
    /// (`gpt-4o-mini-2024-07-18` is priced as `gpt-4o-mini`).
    pub fn price(&self, model: &str) -> Option<&ModelPrice> {
        self.models.get(model).or_else(|| {
            self.models
                .iter()
                .filter(|(name, _)| model.starts_with(name.as_str()))
                .max_by_key(|(name, _)| name.len())
                .map(|(_, p)| p)
        })
    }

    pub fn cost(&self, model: &str, input_tokens: u64, output_tokens: u64) -> Option<f64> {
        self.price(model)
            .map(|p| (input_tokens as f64 * p.input_per_million + output_tokens as f64 * p.output_per_million) / 1e6)
    }
}

/// Facts about the trace that rules match on, besides the Attest trace itself.
#[derive(Debug, Clone, Default)]
pub struct MatchContext {
    pub agent_id: Option<String>,
    pub root_span_name: Option<String>,
    /// Root span attributes and resource attributes (span wins on a clash), as strings.
    pub attributes: HashMap<String, String>,
}

/// Result of converting one closed trace.
#[derive(Debug)]
pub enum Converted {
    Trace {
        trace: Value,
        context: MatchContext,
        /// Spans no chain of parents joins to the root (a missing
        /// intermediate span, a second local root): left out of `trace`.
        unreachable: usize,
        /// Spans nested under a tool or model call that are no step of
        /// their own: named in the trace's `metadata.nested_spans`.
        nested: usize,
    },
    NoRoot,
    UnknownConvention,
}

/// A normalised chat message.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Message {
    pub role: String,
    pub content: String,
    pub tool_calls: Vec<Value>,
}

impl Message {
    fn to_json(&self) -> Value {
        let mut m = json!({"role": self.role, "content": self.content});
        if !self.tool_calls.is_empty() {
            m["tool_calls"] = Value::Array(self.tool_calls.clone());
        }
        m
    }
}

struct Tree<'a> {
    spans: &'a [Span],
    children: HashMap<&'a str, Vec<usize>>,
    prices: &'a PriceTable,
    framework: Framework,
    root: usize,
    /// Spans already turned into steps: duplicate span ids or parent cycles
    /// (spans come from the network) must not make a span count twice.
    visited: std::cell::RefCell<Vec<bool>>,
    /// Spans nested under a tool or model call that became no step of
    /// their own (a model call inside a tool, say), by role and name.
    nested: std::cell::RefCell<Vec<String>>,
}

/// What one (sub-)trace's own steps add up to. A sub-trace's tokens and cost
/// stay its own: layer 7 sums every trace of a tree, so a parent that also
/// counted its children's would count them twice.
#[derive(Default)]
struct Totals {
    input_tokens: u64,
    output_tokens: u64,
    /// Whether any model call reported its usage: without one, the trace's
    /// tokens are unknown, not 0.
    counted: bool,
    cost_usd: f64,
    priced: bool,
    model: Option<String>,
    first_input: Option<String>,
    last_output: Option<String>,
}

impl Totals {
    fn insert_into(&self, metadata: &mut Map<String, Value>) {
        if self.counted {
            metadata.insert("total_tokens".into(), json!(self.input_tokens.saturating_add(self.output_tokens)));
            metadata.insert("input_tokens".into(), json!(self.input_tokens));
            metadata.insert("output_tokens".into(), json!(self.output_tokens));
        }
        if self.priced {
            metadata.insert("cost_usd".into(), json!(self.cost_usd));
        }
    }
}

/// The trace's root: a span without parent, else a span whose parent the
/// exporter flagged as remote (a service called by another process with a
/// W3C `traceparent`, whose caller's spans do not come here); among several,
/// the one that started first.
fn root_index(spans: &[Span]) -> Option<usize> {
    let earliest = |candidates: &mut dyn Iterator<Item = usize>| candidates.min_by_key(|&i| (spans[i].start_unix_nanos, i));
    earliest(&mut (0..spans.len()).filter(|&i| spans[i].parent_span_id.is_none()))
        .or_else(|| earliest(&mut (0..spans.len()).filter(|&i| spans[i].parent_is_remote)))
}

pub fn convert(trace_id: &str, spans: &[Span], prices: &PriceTable) -> Converted {
    // GenAI events that came as log records join their spans first.
    let joined = crate::logs::join(spans);
    let spans = joined.as_deref().unwrap_or(spans);
    let Some(root_idx) = root_index(spans) else {
        return Converted::NoRoot;
    };
    let mut children: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, s) in spans.iter().enumerate() {
        if let Some(p) = &s.parent_span_id {
            children.entry(p.as_str()).or_default().push(i);
        }
    }
    for list in children.values_mut() {
        list.sort_by_key(|&i| (spans[i].start_unix_nanos, spans[i].end_unix_nanos));
    }
    if spans.iter().all(|s| classify(s).0 == SpanRole::Unknown) {
        return Converted::UnknownConvention;
    }
    let framework = Framework::detect(spans);
    framework.rearrange(spans, &mut children);
    let tree = Tree {
        spans,
        children,
        prices,
        framework,
        root: root_idx,
        visited: std::cell::RefCell::new(vec![false; spans.len()]),
        nested: std::cell::RefCell::new(Vec::new()),
    };
    let root = &spans[root_idx];
    let unreachable = spans.len() - tree.reachable(root_idx);
    // The outermost agent span is the trace's own agent; deeper agents become agent_call steps.
    let outer_agent = tree.first_agent(root_idx);
    let agent_id = outer_agent.and_then(|i| tree.agent_name(i));
    let mut totals = Totals::default();
    let steps = tree.steps(root_idx, outer_agent, &mut totals, trace_id);

    let input = tree
        .input_of(root)
        .or_else(|| outer_agent.and_then(|i| tree.input_of(&spans[i])))
        .or(totals.first_input.clone());
    let output = outer_agent
        .and_then(|i| tree.output_of(&spans[i]))
        .or_else(|| tree.output_of(root))
        .or(totals.last_output.clone());

    let mut metadata = Map::new();
    totals.insert_into(&mut metadata);
    metadata.insert("latency_ms".into(), json!(root.duration_ms()));
    if let Some(m) = &totals.model {
        metadata.insert("model".into(), json!(m));
    }
    metadata.insert("timestamp".into(), json!(crate::rfc3339_from_unix_nanos(root.start_unix_nanos)));
    metadata.insert("span_count".into(), json!(spans.len()));
    if let Some(service) = root.resource.get("service.name") {
        metadata.insert("service_name".into(), service.clone());
    }
    metadata.insert("root_span".into(), json!(root.name));
    // The agent's span (the root's when no span names an agent): what an
    // exported evaluation event points at when its assertion names no step.
    metadata.insert("span_id".into(), json!(outer_agent.map_or(&root.span_id, |i| &spans[i].span_id)));
    if framework != Framework::Generic {
        metadata.insert("framework".into(), json!(framework.name()));
    }
    let nested = tree.nested.into_inner();
    if !nested.is_empty() {
        // Named, not dropped: the reader sees what the steps do not show.
        let shown: Vec<&String> = nested.iter().take(16).collect();
        metadata.insert("nested_spans".into(), json!({"count": nested.len(), "names": shown}));
    }

    let mut trace = json!({
        "schema_version": 1,
        "trace_id": trace_id,
        "input": input.map(|m| json!({"user_message": m})).unwrap_or_else(|| json!({})),
        "steps": steps,
        "output": {"message": clip_output(output.unwrap_or_default())},
        "metadata": metadata,
        "parent_trace_id": null,
    });
    if let Some(a) = &agent_id {
        trace["agent_id"] = json!(a);
    }

    let mut attributes = HashMap::new();
    for (k, v) in root.resource.iter().chain(root.attributes.iter()) {
        attributes.insert(k.clone(), scalar_string(v));
    }
    let context = MatchContext {
        agent_id,
        root_span_name: Some(root.name.clone()),
        attributes,
    };
    Converted::Trace {
        trace,
        context,
        unreachable,
        nested: nested.len(),
    }
}

fn scalar_string(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

impl<'a> Tree<'a> {
    fn kids(&self, idx: usize) -> &[usize] {
        self.children
            .get(self.spans[idx].span_id.as_str())
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    /// The span's role: its convention's, as its framework reads it.
    fn role(&self, idx: usize) -> SpanRole {
        self.framework
            .role(&self.spans[idx], classify(&self.spans[idx]).0, idx == self.root)
    }

    /// How many spans the root and its descendants are (each span once,
    /// whatever cycles or repeated ids the links hold).
    fn reachable(&self, root: usize) -> usize {
        self.descendants(root).count() + 1
    }

    /// The spans below `idx`, each once, depth first.
    fn descendants(&self, idx: usize) -> impl Iterator<Item = usize> + '_ {
        let mut seen = vec![false; self.spans.len()];
        seen[idx] = true;
        let mut stack: Vec<usize> = self.kids(idx).iter().rev().copied().collect();
        std::iter::from_fn(move || loop {
            let i = stack.pop()?;
            if std::mem::replace(&mut seen[i], true) {
                continue;
            }
            stack.extend(self.kids(i).iter().rev().copied());
            return Some(i);
        })
    }

    fn first_agent(&self, root: usize) -> Option<usize> {
        let mut queue = std::collections::VecDeque::from([root]);
        let mut seen = vec![false; self.spans.len()];
        while let Some(i) = queue.pop_front() {
            if std::mem::replace(&mut seen[i], true) {
                continue;
            }
            if self.role(i) == SpanRole::Agent {
                return Some(i);
            }
            queue.extend(self.kids(i).iter().copied());
        }
        None
    }

    /// An agent's name, also its `agent_id`, which the engine takes up to 1,024 bytes long.
    fn agent_name(&self, idx: usize) -> Option<String> {
        let span = &self.spans[idx];
        let mut below = self.descendants(idx).map(|i| &self.spans[i]);
        agent_name(span)
            .or_else(|| self.framework.agent_name(span, &mut below).map(|n| clip_to(n, MAX_ID_BYTES)))
            .or_else(|| {
                // A framework's agent span that is named only by its span name.
                (self.role(idx) == SpanRole::Agent && self.framework != Framework::Generic && !span.name.is_empty())
                    .then(|| clip_to(span.name.clone(), MAX_ID_BYTES))
            })
    }

    /// The user's message an agent or root span records, as its framework writes it.
    fn input_of(&self, span: &Span) -> Option<String> {
        match span.attr_str("input.value").map(|raw| self.framework.input_text(raw)) {
            Some(Some(read)) => read,
            _ => span_input(span),
        }
    }

    /// The final answer an agent or root span records, as its framework writes it.
    fn output_of(&self, span: &Span) -> Option<String> {
        match span.attr_str("output.value").map(|raw| self.framework.output_text(raw)) {
            Some(Some(read)) => read,
            _ => span_output(span),
        }
    }

    /// Steps under `idx` in start order; `own_agent` is walked through rather than made a step.
    fn steps(&self, idx: usize, own_agent: Option<usize>, totals: &mut Totals, trace_id: &str) -> Vec<Value> {
        let mut out = Vec::new();
        let level = Level { trace_id, agents: 0 };
        self.walk(idx, own_agent, totals, &level, &mut out, 0);
        fill_tool_args(&mut out);
        out
    }

    fn walk(&self, idx: usize, own_agent: Option<usize>, totals: &mut Totals, level: &Level<'_>, out: &mut Vec<Value>, depth: usize) {
        // Span trees come from the network: parent links may form cycles or be very deep.
        if depth > 256 || std::mem::replace(&mut self.visited.borrow_mut()[idx], true) {
            return;
        }
        let span = &self.spans[idx];
        let role = self.role(idx);
        let step = match role {
            SpanRole::Llm => self.llm_step(span, totals),
            SpanRole::Tool => self.tool_step(span),
            SpanRole::Retrieval => retrieval_step(span),
            // Agents nested deeper than sub-traces may go have their steps
            // taken into the deepest sub-trace allowed instead.
            SpanRole::Agent if Some(idx) != own_agent && level.agents < MAX_SUB_TRACE_DEPTH => self.agent_step(idx, totals, level, depth),
            _ => {
                for &k in self.kids(idx) {
                    self.walk(k, own_agent, totals, level, out, depth + 1);
                }
                return;
            }
        };
        let step = if role == SpanRole::Agent {
            step
        } else {
            let mut delegate = None;
            self.walk_nested(idx, idx, totals, level, depth + 1, &mut delegate);
            match delegate {
                // An agent run as a tool is a delegation: its agent_call
                // stands where the tool call would, with the tool's arguments.
                Some(mut agent) if role == SpanRole::Tool => {
                    agent["args"] = step["args"].clone();
                    agent["metadata"]["tool_name"] = step["name"].clone();
                    agent
                }
                Some(agent) => {
                    out.push(fit_result(timed(step, span)));
                    agent
                }
                None => step,
            }
        };
        out.push(fit_result(timed(step, span)));
    }

    /// The spans under a tool, model call or retrieval (`under`): the first
    /// agent among them becomes a sub-trace (`delegate`); the others are no
    /// steps of their own, so they are named and counted, and their model
    /// calls' tokens and cost still count, since they were spent.
    fn walk_nested(&self, idx: usize, under: usize, totals: &mut Totals, level: &Level<'_>, depth: usize, delegate: &mut Option<Value>) {
        if depth > 256 {
            return;
        }
        for &k in self.kids(idx) {
            // A span cannot hold itself: a repeated span id is no nesting.
            if self.spans[k].span_id == self.spans[idx].span_id || self.visited.borrow()[k] {
                continue;
            }
            let role = self.role(k);
            if role == SpanRole::Agent && delegate.is_none() && level.agents < MAX_SUB_TRACE_DEPTH {
                *delegate = Some(self.agent_step(k, totals, level, depth));
                continue;
            }
            self.visited.borrow_mut()[k] = true;
            let span = &self.spans[k];
            let kind = match role {
                // A model call under a model call is the same call recorded
                // twice (two instrumentations of one client): its tokens
                // were counted with the outer one.
                SpanRole::Llm if self.role(idx) == SpanRole::Llm => Some("llm_call (the same call, instrumented twice)"),
                SpanRole::Llm => {
                    let (in_t, out_t, cost) = self.usage(span);
                    totals.add_usage(in_t, out_t, cost);
                    Some("llm_call")
                }
                SpanRole::Tool => Some("tool_call"),
                SpanRole::Retrieval => Some("retrieval"),
                SpanRole::Agent => Some("agent"),
                _ => None,
            };
            if let Some(kind) = kind {
                self.nested.borrow_mut().push(format!(
                    "{kind} {:?} under {:?}",
                    prefix(&span.name, 128),
                    prefix(&self.spans[under].name, 128)
                ));
            }
            self.walk_nested(k, under, totals, level, depth + 1, delegate);
        }
    }

    fn agent_step(&self, idx: usize, parent_totals: &mut Totals, level: &Level<'_>, depth: usize) -> Value {
        let span = &self.spans[idx];
        self.visited.borrow_mut()[idx] = true;
        let name = self.agent_name(idx).unwrap_or_else(|| step_name(&span.name, "agent"));
        let mut totals = Totals::default();
        let mut steps = Vec::new();
        // The sub-trace's id extends its parent's, so that each sub-trace
        // names the trace it sits in as its parent, at every depth.
        let sub_id = format!("{}:{}", level.trace_id, span.span_id);
        let inner = Level {
            trace_id: &sub_id,
            agents: level.agents + 1,
        };
        for &k in self.kids(idx) {
            self.walk(k, Some(idx), &mut totals, &inner, &mut steps, depth + 1);
        }
        fill_tool_args(&mut steps);
        let input = self.input_of(span).or(totals.first_input.clone());
        let output = self.output_of(span).or(totals.last_output.clone()).unwrap_or_default();
        // The delegate's answer is the latest answer of the run so far.
        if !output.is_empty() {
            parent_totals.last_output = Some(output.clone());
        }
        if parent_totals.first_input.is_none() {
            parent_totals.first_input = input.clone();
        }
        if parent_totals.model.is_none() {
            parent_totals.model = totals.model.clone();
        }
        let mut metadata = Map::new();
        totals.insert_into(&mut metadata);
        metadata.insert("latency_ms".into(), json!(span.duration_ms()));
        if let Some(m) = &totals.model {
            metadata.insert("model".into(), json!(m));
        }
        json!({
            "type": "agent_call",
            "name": name,
            "agent_id": name,
            "args": {"input": input},
            "result": {"output": output},
            "sub_trace": {
                "schema_version": 1,
                "trace_id": sub_id,
                "agent_id": name,
                "parent_trace_id": level.trace_id,
                "input": input.map(|m| json!({"user_message": m})).unwrap_or_else(|| json!({})),
                "steps": steps,
                "output": {"message": clip_output(output.clone())},
                "metadata": metadata,
            },
            "metadata": step_metadata(span),
        })
    }

    /// A model call's token counts (`None` when it reported none) and cost.
    fn usage(&self, span: &Span) -> (Option<u64>, Option<u64>, Option<f64>) {
        let input_tokens = first_u64(
            span,
            &["gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens", "llm.token_count.prompt"],
        );
        let output_tokens = first_u64(
            span,
            &[
                "gen_ai.usage.output_tokens",
                "gen_ai.usage.completion_tokens",
                "llm.token_count.completion",
            ],
        );
        let cost = llm_model(span).and_then(|m| {
            (input_tokens.is_some() || output_tokens.is_some())
                .then(|| self.prices.cost(&m, input_tokens.unwrap_or(0), output_tokens.unwrap_or(0)))
                .flatten()
        });
        (input_tokens, output_tokens, cost)
    }

    fn llm_step(&self, span: &Span, totals: &mut Totals) -> Value {
        let model = llm_model(span);
        let (input_tokens, output_tokens, cost) = self.usage(span);
        let inputs = input_messages(span);
        let mut outputs = output_messages(span);
        if outputs.is_empty() {
            outputs = self.framework.llm_outputs(span);
        }
        let completion = outputs.iter().rev().find(|m| !m.content.is_empty()).map(|m| m.content.clone());
        let tool_calls: Vec<Value> = outputs.iter().flat_map(|m| m.tool_calls.clone()).collect();
        if totals.first_input.is_none() {
            totals.first_input = inputs.iter().rev().find(|m| m.role == "user").map(|m| m.content.clone());
        }
        if completion.is_some() {
            totals.last_output = completion.clone();
        }
        totals.add_usage(input_tokens, output_tokens, cost);
        let mut metadata = step_metadata(span);
        if let Some(m) = &model {
            if totals.model.is_none() {
                totals.model = Some(m.clone());
            }
        }
        if let Some(cost) = cost {
            metadata["cost_usd"] = json!(cost);
        }
        let tokens = (input_tokens.is_some() || output_tokens.is_some())
            .then(|| input_tokens.unwrap_or(0).saturating_add(output_tokens.unwrap_or(0)));
        if let Some(t) = input_tokens {
            metadata["input_tokens"] = json!(t);
        }
        if let Some(t) = output_tokens {
            metadata["output_tokens"] = json!(t);
        }
        let provider = first_str(span, &["gen_ai.provider.name", "gen_ai.system", "llm.provider", "llm.system"]);
        let prompt = inputs
            .iter()
            .map(|m| format!("{}: {}", m.role, m.content))
            .collect::<Vec<_>>()
            .join("\n");
        let finish = span
            .attributes
            .get("gen_ai.response.finish_reasons")
            .and_then(|v| v.as_array().and_then(|a| a.first()).and_then(Value::as_str).map(str::to_string))
            .or_else(|| span.attr_str("llm.finish_reason").map(str::to_string));
        json!({
            "type": "llm_call",
            "name": step_name(&span.name, "llm_call"),
            "args": {
                "model": model,
                "provider": provider,
                "prompt": prompt,
                "messages": inputs.iter().map(Message::to_json).collect::<Vec<_>>(),
            },
            "result": {
                "completion": completion,
                "tool_calls": tool_calls,
                "tokens": tokens,
                "finish_reason": finish,
            },
            "metadata": metadata,
        })
    }

    fn tool_step(&self, span: &Span) -> Value {
        let name =
            first_str(span, &["gen_ai.tool.name", "tool.name", "traceloop.entity.name"]).unwrap_or_else(|| step_name(&span.name, "tool"));
        let raw_args = first_value(
            span,
            &[
                "gen_ai.tool.call.arguments",
                "input.value",
                "traceloop.entity.input",
                "mlflow.spanInputs",
                "tool.parameters",
            ],
        )
        .map(unwrap_call_input);
        let args = raw_args
            .as_ref()
            .and_then(|v| self.framework.tool_args(v))
            .or_else(|| raw_args.map(|v| as_object(v, "input")))
            .unwrap_or_else(|| json!({}));
        let raw_result = first_value(
            span,
            &[
                "gen_ai.tool.call.result",
                "output.value",
                "traceloop.entity.output",
                "mlflow.spanOutputs",
            ],
        );
        let (result, call_id) = match raw_result.as_ref().and_then(|v| self.framework.tool_result(v)) {
            Some((result, id)) => (result, id),
            None => (raw_result.map(|v| as_object(v, "output")).unwrap_or_else(|| json!({})), None),
        };
        let mut metadata = step_metadata(span);
        if let Some(id) = call_id.or_else(|| first_str(span, &["gen_ai.tool.call.id", "tool_call.id"])) {
            metadata["tool_call_id"] = json!(id);
        }
        json!({"type": "tool_call", "name": name, "args": args, "result": result, "metadata": metadata})
    }
}

impl Totals {
    fn add_usage(&mut self, input_tokens: Option<u64>, output_tokens: Option<u64>, cost: Option<f64>) {
        if input_tokens.is_some() || output_tokens.is_some() {
            self.counted = true;
            self.input_tokens = self.input_tokens.saturating_add(input_tokens.unwrap_or(0));
            self.output_tokens = self.output_tokens.saturating_add(output_tokens.unwrap_or(0));
        }
        if let Some(c) = cost {
            self.cost_usd += c;
            self.priced = true;
        }
    }
}

/// Traceloop records a decorated function's call as `{"args": [...], "kwargs": {...}}`:
/// its keyword arguments are the tool's arguments.
fn unwrap_call_input(v: Value) -> Value {
    let parsed = match &v {
        Value::String(s) if s.trim_start().starts_with('{') => serde_json::from_str::<Value>(s).ok(),
        Value::Object(_) => Some(v.clone()),
        _ => None,
    };
    match parsed {
        Some(Value::Object(o)) if o.len() == 2 && o.contains_key("args") && o.get("kwargs").is_some_and(Value::is_object) => {
            o.get("kwargs").cloned().unwrap_or(v)
        }
        _ => v,
    }
}

fn llm_model(span: &Span) -> Option<String> {
    first_str(span, &["gen_ai.request.model", "gen_ai.response.model", "llm.model_name"])
}

/// The step with the span's start and end, in Unix milliseconds (the
/// timing checks of layer 7 read them).
fn timed(mut step: Value, span: &Span) -> Value {
    let ms = |nanos: u64| (nanos / 1_000) as f64 / 1_000.0;
    step["started_at_ms"] = json!(ms(span.start_unix_nanos));
    step["ended_at_ms"] = json!(ms(span.end_unix_nanos.max(span.start_unix_nanos)));
    step
}

/// Tool steps whose span did not hold the arguments as an object (a
/// framework that records a single argument bare) take them from the model's
/// tool call they answer: by call id when known, else the first call of that
/// name not yet answered.
fn fill_tool_args(steps: &mut [Value]) {
    let mut calls: Vec<(Option<String>, String, Value)> = Vec::new();
    for step in steps.iter_mut() {
        match step["type"].as_str() {
            Some("llm_call") => {
                for c in step["result"]["tool_calls"].as_array().into_iter().flatten() {
                    let args = match &c["arguments"] {
                        Value::String(s) => serde_json::from_str::<Value>(s).ok(),
                        v @ Value::Object(_) => Some(v.clone()),
                        _ => None,
                    };
                    if let (Some(name), Some(args @ Value::Object(_))) = (c["name"].as_str(), args) {
                        calls.push((c["id"].as_str().map(str::to_owned), name.to_owned(), args));
                    }
                }
            }
            Some("tool_call") => {
                let name = step["name"].as_str().unwrap_or("").to_owned();
                let id = step["metadata"]["tool_call_id"].as_str().map(str::to_owned);
                let pos = id
                    .as_ref()
                    .and_then(|id| calls.iter().position(|(cid, _, _)| cid.as_deref() == Some(id.as_str())))
                    .or_else(|| calls.iter().position(|(_, n, _)| *n == name));
                let Some(pos) = pos else { continue };
                let (_, _, args) = calls.remove(pos);
                let args_obj = &step["args"];
                let bare = args_obj
                    .as_object()
                    .is_some_and(|o| o.is_empty() || (o.len() == 1 && o.contains_key("input") && !o["input"].is_object()));
                if bare
                    && args_obj.get("input").is_none_or(|v| {
                        args.as_object()
                            .is_some_and(|a| a.len() == 1 && a.values().any(|x| x == v || v.as_str() == Some(scalar_string(x).as_str())))
                    })
                {
                    step["args"] = args;
                }
            }
            _ => {}
        }
    }
}

fn step_metadata(span: &Span) -> Value {
    let mut m = json!({"duration_ms": span.duration_ms(), "span_id": span.span_id});
    if span.is_error {
        m["error"] = json!(true);
    }
    m
}

/// An agent's name, also its `agent_id`, which the engine takes up to 1,024 bytes long.
fn agent_name(span: &Span) -> Option<String> {
    first_str(
        span,
        &["gen_ai.agent.name", "agent.name", "gen_ai.agent.id", "traceloop.entity.name"],
    )
    .or_else(|| {
        // `invoke_agent {name}` is the GenAI span name when the attribute is missing.
        span.name.strip_prefix("invoke_agent ").map(str::to_string)
    })
    .or_else(|| {
        // OpenInference sets no name attribute of its own on AGENT spans
        // (its tracer's `@agent(name=...)` names the span): the span
        // name is the agent's name.
        (classify(span) == (SpanRole::Agent, Some(Convention::OpenInference)) && !span.name.is_empty()).then(|| span.name.clone())
    })
    .map(|n| clip_to(n, MAX_ID_BYTES))
}

/// `s` cut to at most `max` bytes, on a character boundary.
fn clip_to(mut s: String, max: usize) -> String {
    let keep = prefix(&s, max).len();
    s.truncate(keep);
    s
}

/// The longest start of `s` of at most `max` bytes that ends on a character boundary.
fn prefix(s: &str, max: usize) -> &str {
    let mut end = max.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A step's name: the engine requires one, and spans may have none.
fn step_name(name: &str, fallback: &str) -> String {
    if name.is_empty() {
        fallback.to_owned()
    } else {
        name.to_owned()
    }
}

fn retrieval_step(span: &Span) -> Value {
    let query = first_value(span, &["input.value"]).unwrap_or(Value::Null);
    let mut documents = Vec::new();
    for i in 0..10_000 {
        let p = format!("retrieval.documents.{i}.document.");
        let content = span.attr_str(&format!("{p}content"));
        let id = span.attributes.get(&format!("{p}id"));
        if content.is_none() && id.is_none() {
            break;
        }
        documents.push(json!({
            "id": id,
            "text": content,
            "score": span.attributes.get(&format!("{p}score")),
        }));
    }
    json!({
        "type": "retrieval",
        "name": step_name(&span.name, "retrieval"),
        "args": {"query": query},
        "result": {"documents": documents},
        "metadata": step_metadata(span),
    })
}

/// Parses a JSON-encoded attribute; an object stays as it is, anything else is wrapped.
/// Text nested deeper than [`MAX_PARSED_DEPTH`] stays text: placed in the
/// trace, it could pass the nesting the engine's parser accepts.
fn as_object(v: Value, key: &str) -> Value {
    let parsed = match &v {
        Value::String(s) => serde_json::from_str::<Value>(s)
            .ok()
            .filter(|p| nesting(p, MAX_PARSED_DEPTH + 1) <= MAX_PARSED_DEPTH)
            .unwrap_or(v),
        _ => v,
    };
    match parsed {
        Value::Object(_) => parsed,
        other => json!({ key: other }),
    }
}

/// Sub-traces nest at most this deep below the root (Attest protocol v1
/// §7, which the engine's trace validation applies).
const MAX_SUB_TRACE_DEPTH: usize = 5;
/// Longest `output.message`, in characters (§7).
const MAX_OUTPUT_CHARS: usize = 500_000;
/// Longest agent id (the engine's limit on ids).
const MAX_ID_BYTES: usize = 1024;
/// Largest step `result`, compact JSON bytes (§7).
const MAX_STEP_RESULT_BYTES: usize = 1 << 20;
/// Deepest JSON taken from a text attribute.
const MAX_PARSED_DEPTH: usize = 32;

/// Where a walk is: the (sub-)trace whose steps it collects, and how many
/// sub-traces deep that is.
struct Level<'a> {
    trace_id: &'a str,
    agents: usize,
}

/// `v`'s nesting depth, counted no further than `cap`.
fn nesting(v: &Value, cap: usize) -> usize {
    if cap == 0 {
        return 0;
    }
    match v {
        Value::Array(a) => 1 + a.iter().map(|x| nesting(x, cap - 1)).max().unwrap_or(0),
        Value::Object(o) => 1 + o.values().map(|x| nesting(x, cap - 1)).max().unwrap_or(0),
        _ => 0,
    }
}

/// An output longer than the engine accepts, cut with a note: the trace is
/// still evaluated, on what an evaluator could be given.
fn clip_output(text: String) -> String {
    // No more bytes than the limit in characters: nothing to count.
    if text.len() <= MAX_OUTPUT_CHARS {
        return text;
    }
    match text.char_indices().nth(MAX_OUTPUT_CHARS - 64) {
        Some((end, _)) if text.chars().count() > MAX_OUTPUT_CHARS => {
            format!("{}… [clipped by attest-collect: {} bytes more]", &text[..end], text.len() - end)
        }
        _ => text,
    }
}

/// A step whose `result` is larger than the engine accepts keeps its start,
/// as text, with a note.
fn fit_result(mut step: Value) -> Value {
    let Some(result) = step.get("result") else { return step };
    if attest_trace::text::compact_len(result) <= MAX_STEP_RESULT_BYTES {
        return step;
    }
    let text = result.to_string();
    // Kept as a string, the start is escaped once more, which can double it.
    let start = prefix(&text, MAX_STEP_RESULT_BYTES / 4);
    step["result"] = json!({
        "clipped": format!("{start}…"),
        "clipped_bytes": text.len() - start.len(),
    });
    step
}

fn first_str(span: &Span, keys: &[&str]) -> Option<String> {
    keys.iter()
        .find_map(|k| span.attr_str(k).filter(|s| !s.is_empty()).map(str::to_string))
}

fn first_value(span: &Span, keys: &[&str]) -> Option<Value> {
    keys.iter().find_map(|k| span.attributes.get(*k).cloned())
}

fn first_u64(span: &Span, keys: &[&str]) -> Option<u64> {
    keys.iter().find_map(|k| {
        span.attributes
            .get(*k)
            .and_then(|v| v.as_u64().or_else(|| v.as_str().and_then(|s| s.parse().ok())))
    })
}

/// Input text of an agent or root span (`input.value`, or GenAI input messages).
fn span_input(span: &Span) -> Option<String> {
    if let Some(v) = span.attr_str("input.value") {
        return Some(v.to_string());
    }
    let msgs = genai_messages(span, "gen_ai.input.messages");
    msgs.iter().find(|m| m.role == "user").map(|m| m.content.clone())
}

fn span_output(span: &Span) -> Option<String> {
    if let Some(v) = span.attr_str("output.value") {
        return Some(v.to_string());
    }
    let msgs = genai_messages(span, "gen_ai.output.messages");
    msgs.iter().rev().find(|m| !m.content.is_empty()).map(|m| m.content.clone())
}

fn input_messages(span: &Span) -> Vec<Message> {
    let current = genai_messages(span, "gen_ai.input.messages");
    if !current.is_empty() {
        return current;
    }
    let oi = indexed_messages(span, "llm.input_messages");
    if !oi.is_empty() {
        return oi;
    }
    let events = event_messages(span, false);
    if !events.is_empty() {
        return events;
    }
    legacy_genai(span, "gen_ai.prompt", "gen_ai.content.prompt")
}

fn output_messages(span: &Span) -> Vec<Message> {
    let current = genai_messages(span, "gen_ai.output.messages");
    if !current.is_empty() {
        return current;
    }
    let oi = indexed_messages(span, "llm.output_messages");
    if !oi.is_empty() {
        return oi;
    }
    let events = event_messages(span, true);
    if !events.is_empty() {
        return events;
    }
    legacy_genai(span, "gen_ai.completion", "gen_ai.content.completion")
}

/// Current GenAI conventions: a JSON array of `{role, parts: [{type, content | name, arguments | response}]}`,
/// as a span attribute or, sent as a log event (`gen_ai.client.inference.operation.details`), as an attribute of one of the span's events.
fn genai_messages(span: &Span, key: &str) -> Vec<Message> {
    let Some(raw) = span
        .attributes
        .get(key)
        .or_else(|| span.events.iter().find_map(|e| e.attributes.get(key)))
    else {
        return vec![];
    };
    let parsed = match raw {
        Value::String(s) => serde_json::from_str::<Value>(s).unwrap_or(Value::Null),
        other => other.clone(),
    };
    parsed.as_array().map(|a| a.iter().map(genai_message).collect()).unwrap_or_default()
}

/// GenAI conventions up to 1.36 sent as one event per message
/// (`gen_ai.user.message`, ..., `gen_ai.choice`), whose body is the message:
/// the input messages, or with `output` the choices.
fn event_messages(span: &Span, output: bool) -> Vec<Message> {
    span.events
        .iter()
        .filter_map(|e| {
            let role = match e.name.as_str() {
                "gen_ai.choice" if output => "assistant",
                "gen_ai.system.message" if !output => "system",
                "gen_ai.user.message" if !output => "user",
                "gen_ai.assistant.message" if !output => "assistant",
                "gen_ai.tool.message" if !output => "tool",
                _ => return None,
            };
            let body = e.attributes.get("body").cloned().unwrap_or(Value::Null);
            let body = if output {
                body.get("message").cloned().unwrap_or(body)
            } else {
                body
            };
            let mut m = genai_message(&body);
            if m.role.is_empty() {
                m.role = role.to_owned();
            }
            if let Some(calls) = body.get("tool_calls").and_then(Value::as_array) {
                m.tool_calls.extend(
                    calls
                        .iter()
                        .map(|c| json!({"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]})),
                );
            }
            Some(m)
        })
        .collect()
}

fn genai_message(v: &Value) -> Message {
    let mut m = Message {
        role: v["role"].as_str().unwrap_or("").to_string(),
        ..Default::default()
    };
    if let Some(parts) = v["parts"].as_array() {
        let mut texts = Vec::new();
        for p in parts {
            match p["type"].as_str() {
                Some("text") => texts.push(p["content"].as_str().unwrap_or("").to_string()),
                Some("tool_call") => m.tool_calls.push(json!({
                    "id": p["id"], "name": p["name"], "arguments": p["arguments"],
                })),
                Some("tool_call_response") => texts.push(scalar_string(&p["response"])),
                _ => {}
            }
        }
        // Separate text parts are separate blocks of the message (a model
        // may answer in several): kept apart by a line break, not run
        // together. Empty ones add nothing, not even a line break, so a
        // message of empty parts stays empty.
        texts.retain(|t| !t.is_empty());
        m.content = texts.join("\n");
    } else if let Some(c) = v.get("content") {
        // Older shape: {role, content} (events and the `gen_ai.prompt` attribute).
        m.content = scalar_string(c);
    } else if let Some(c) = v.get("message").and_then(|m| m.get("content")) {
        m.content = scalar_string(c);
    }
    m
}

/// OpenInference flattened messages: `llm.input_messages.{i}.message.role|content|tool_calls.{j}.tool_call.function.name|arguments`.
/// A message sent as parts (an OpenAI `content` array) has no `message.content`
/// but `message.contents.{k}.message_content.type|text`: its text parts make
/// the content, one line break apart, as GenAI parts do; image parts have no text.
fn indexed_messages(span: &Span, prefix: &str) -> Vec<Message> {
    // Indices need not start at 0 nor be contiguous (the OpenAI Agents
    // instrumentation numbers a Responses API input from 1): every index the
    // attributes name counts, in order.
    let mut indices = std::collections::BTreeSet::new();
    let head = format!("{prefix}.");
    for key in span.attributes.keys() {
        if let Some(i) = key
            .strip_prefix(&head)
            .and_then(|rest| rest.split('.').next())
            .and_then(|i| i.parse::<usize>().ok())
        {
            indices.insert(i);
        }
    }
    let mut out = Vec::new();
    for i in indices {
        let p = format!("{prefix}.{i}.message.");
        let role = span.attr_str(&format!("{p}role"));
        let content = span.attr_str(&format!("{p}content"));
        let content = match content {
            Some(c) => c.to_string(),
            None => content_parts(span, &p),
        };
        let mut m = Message {
            role: role.unwrap_or("").to_string(),
            content,
            tool_calls: vec![],
        };
        for j in 0..10_000 {
            let tp = format!("{p}tool_calls.{j}.tool_call.");
            let Some(name) = span.attr_str(&format!("{tp}function.name")) else {
                break;
            };
            m.tool_calls.push(json!({
                "id": span.attributes.get(&format!("{tp}id")),
                "name": name,
                "arguments": span.attributes.get(&format!("{tp}function.arguments")),
            }));
        }
        out.push(m);
    }
    out
}

/// The text of an OpenInference message given as parts (`{message}contents.{k}.message_content.…`).
fn content_parts(span: &Span, message: &str) -> String {
    let mut texts = Vec::new();
    for k in 0..10_000 {
        let part = format!("{message}contents.{k}.message_content.");
        let Some(kind) = span.attr_str(&format!("{part}type")) else {
            break;
        };
        if kind == "text" {
            if let Some(text) = span.attr_str(&format!("{part}text")).filter(|t| !t.is_empty()) {
                texts.push(text);
            }
        }
    }
    texts.join("\n")
}

/// GenAI conventions before structured messages: the `gen_ai.prompt` / `gen_ai.completion`
/// attribute (JSON list of `{role, content}`), the same on span events
/// `gen_ai.content.prompt` / `gen_ai.content.completion`, or indexed
/// `gen_ai.prompt.{i}.role|content`.
fn legacy_genai(span: &Span, attr: &str, event: &str) -> Vec<Message> {
    let from_value = |v: &Value| -> Vec<Message> {
        let parsed = match v {
            Value::String(s) => serde_json::from_str::<Value>(s).unwrap_or_else(|_| json!([{"role": "", "content": s}])),
            other => other.clone(),
        };
        match parsed {
            Value::Array(a) => a.iter().map(genai_message).collect(),
            Value::Object(_) => vec![genai_message(&parsed)],
            _ => vec![],
        }
    };
    if let Some(v) = span.attributes.get(attr) {
        return from_value(v);
    }
    if let Some(e) = span.events.iter().find(|e| e.name == event) {
        if let Some(v) = e.attributes.get(attr) {
            return from_value(v);
        }
    }
    let mut out = Vec::new();
    for i in 0..10_000 {
        let role = span.attr_str(&format!("{attr}.{i}.role"));
        let content = span.attr_str(&format!("{attr}.{i}.content"));
        if role.is_none() && content.is_none() {
            break;
        }
        out.push(Message {
            role: role
                .unwrap_or(if attr == "gen_ai.completion" { "assistant" } else { "" })
                .to_string(),
            content: content.unwrap_or("").to_string(),
            tool_calls: vec![],
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn the_text_parts_of_a_message_stay_apart() {
        let parts = json!([{"role": "assistant", "parts": [
            {"type": "text", "content": "first"}, {"type": "tool_call", "name": "t"}, {"type": "text", "content": "完成 ✅"}]}]);
        let s = span("a", None, "chat", 1, json!({"gen_ai.output.messages": parts.to_string()}));
        let m = genai_messages(&s, "gen_ai.output.messages");
        assert_eq!(m[0].content, "first\n完成 ✅");
        assert_eq!(m[0].tool_calls.len(), 1);
        let empty = json!([{"role": "assistant", "parts": [
            {"type": "text", "content": ""}, {"type": "tool_call", "name": "t"}, {"type": "text"}]}]);
        let s = span("b", None, "chat", 1, json!({"gen_ai.output.messages": empty.to_string()}));
        assert_eq!(genai_messages(&s, "gen_ai.output.messages")[0].content, "");
    }

    fn span(id: &str, parent: Option<&str>, name: &str, start: u64, attrs: Value) -> Span {
        Span {
            trace_id: "t".into(),
            span_id: id.into(),
            parent_span_id: parent.map(Into::into),
            parent_is_remote: false,
            name: name.into(),
            start_unix_nanos: start * 1_000_000,
            end_unix_nanos: (start + 10) * 1_000_000,
            attributes: attrs.as_object().unwrap().clone(),
            events: vec![],
            resource: Arc::new(json!({"service.name": "svc"}).as_object().unwrap().clone()),
            scope: "".into(),
            log_event: false,
            is_error: false,
            size_bytes: 1,
        }
    }

    fn prices() -> PriceTable {
        PriceTable {
            models: [(
                "gpt-4o".to_string(),
                ModelPrice {
                    input_per_million: 1.0,
                    output_per_million: 2.0,
                },
            )]
            .into(),
        }
    }

    /// A chain of `n` agents, each the parent of the next, the last calling a tool.
    fn agent_chain(n: usize, tool_attrs: Value) -> Vec<Span> {
        let mut spans: Vec<Span> = (0..n)
            .map(|i| {
                let parent = (i > 0).then(|| format!("a{}", i - 1));
                span(
                    &format!("a{i}"),
                    parent.as_deref(),
                    &format!("invoke_agent agent{i}"),
                    i as u64,
                    json!({"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": format!("agent{i}")}),
                )
            })
            .collect();
        spans.push(span("tool", Some(&format!("a{}", n - 1)), "execute_tool t", n as u64, tool_attrs));
        spans
    }

    /// Each sub-trace and its depth below the root, depth first.
    fn sub_traces(trace: &Value, depth: usize, out: &mut Vec<(usize, Value)>) {
        for step in trace["steps"].as_array().into_iter().flatten() {
            if let Some(sub) = step.get("sub_trace") {
                assert_eq!(sub["parent_trace_id"], trace["trace_id"], "a sub-trace names the trace it sits in");
                out.push((depth + 1, sub.clone()));
                sub_traces(sub, depth + 1, out);
            }
        }
    }

    #[test]
    fn nested_agents_name_their_own_parent_and_nest_no_deeper_than_the_engine_accepts() {
        for n in [3, 6, 9] {
            let spans = agent_chain(n, json!({"gen_ai.tool.name": "t", "gen_ai.tool.call.result": "ok"}));
            let Converted::Trace { trace, .. } = convert("t", &spans, &prices()) else {
                panic!("not converted")
            };
            let mut subs = Vec::new();
            sub_traces(&trace, 0, &mut subs);
            let deepest = subs.iter().map(|(d, _)| *d).max().unwrap();
            assert_eq!(deepest, (n - 1).min(MAX_SUB_TRACE_DEPTH), "{n} agents");
            assert_eq!(subs[0].1["trace_id"], "t:a1");
            assert_eq!(subs[1].1["trace_id"], "t:a1:a2");
            // The tool call is kept however deep the chain: in the deepest sub-trace.
            let last = &subs.last().unwrap().1;
            assert_eq!(last["steps"].as_array().unwrap().last().unwrap()["name"], "t", "{n} agents: {last}");
        }
    }

    #[test]
    fn values_past_the_engines_limits_are_clipped_not_left_to_fail_the_trace() {
        let big_result = "r".repeat(MAX_STEP_RESULT_BYTES + 10);
        let deep_args = format!("{}1{}", "[".repeat(120), "]".repeat(120));
        let mut spans = agent_chain(
            1,
            json!({"gen_ai.tool.name": "t", "gen_ai.tool.call.result": big_result, "gen_ai.tool.call.arguments": deep_args}),
        );
        spans[0]
            .attributes
            .insert("output.value".into(), json!("o".repeat(MAX_OUTPUT_CHARS + 1)));
        spans[0].attributes.insert("gen_ai.usage.input_tokens".into(), json!(u64::MAX));
        let Converted::Trace { trace, .. } = convert("t", &spans, &prices()) else {
            panic!("not converted")
        };
        let message = trace["output"]["message"].as_str().unwrap();
        assert!(
            message.chars().count() <= MAX_OUTPUT_CHARS && message.ends_with("bytes more]"),
            "{}",
            message.len()
        );
        let tool = &trace["steps"][0];
        assert!(tool["result"].to_string().len() <= MAX_STEP_RESULT_BYTES);
        assert!(
            tool["result"]["clipped"].as_str().unwrap().starts_with("{\"output\":\"rrr"),
            "the start is kept"
        );
        assert!(tool["result"]["clipped_bytes"].as_u64().unwrap() > (MAX_STEP_RESULT_BYTES / 2) as u64);
        assert!(tool["args"]["input"].is_string(), "JSON nested 120 deep stays text");
        // A result of quotes doubles when escaped again; the clip leaves room.
        let mut quotes = agent_chain(
            1,
            json!({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.call.result": "\"".repeat(2 * MAX_STEP_RESULT_BYTES)}),
        );
        quotes[1].name = String::new();
        quotes[0].attributes.insert("gen_ai.agent.name".into(), json!("n".repeat(5000)));
        let Converted::Trace { trace, .. } = convert("t", &quotes, &prices()) else {
            panic!("not converted")
        };
        let tool = &trace["steps"][0];
        assert!(tool["result"].to_string().len() <= MAX_STEP_RESULT_BYTES);
        assert_eq!(tool["name"], "tool", "a step is never nameless: {}", tool["type"]);
        assert_eq!(trace["agent_id"].as_str().unwrap().len(), MAX_ID_BYTES);
    }

    #[test]
    fn token_counts_saturate_instead_of_wrapping() {
        let spans = vec![
            span(
                "r",
                None,
                "invoke_agent a",
                0,
                json!({"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "a"}),
            ),
            span(
                "l",
                Some("r"),
                "chat m",
                1,
                json!({"gen_ai.operation.name": "chat", "gen_ai.request.model": "m", "gen_ai.usage.input_tokens": u64::MAX, "gen_ai.usage.output_tokens": 1}),
            ),
        ];
        let Converted::Trace { trace, .. } = convert("t", &spans, &prices()) else {
            panic!("not converted")
        };
        assert_eq!(trace["metadata"]["total_tokens"], u64::MAX);
    }

    fn agent(id: &str, parent: Option<&str>, name: &str, start: u64) -> Span {
        span(
            id,
            parent,
            &format!("invoke_agent {name}"),
            start,
            json!({"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": name}),
        )
    }

    fn chat(id: &str, parent: &str, start: u64, tokens: (u64, u64)) -> Span {
        span(
            id,
            Some(parent),
            "chat gpt-4o",
            start,
            json!({"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o", "gen_ai.usage.input_tokens": tokens.0, "gen_ai.usage.output_tokens": tokens.1}),
        )
    }

    fn tool(id: &str, parent: &str, name: &str, start: u64) -> Span {
        span(
            id,
            Some(parent),
            &format!("execute_tool {name}"),
            start,
            json!({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name, "gen_ai.tool.call.arguments": "{\"q\": 1}"}),
        )
    }

    #[test]
    fn an_agent_run_as_a_tool_is_a_delegation_in_the_tools_place() {
        let spans = vec![
            agent("r", None, "boss", 0),
            chat("l", "r", 1, (10, 0)),
            tool("t", "r", "ask_refund_desk", 20),
            agent("a", Some("t"), "refund-desk", 21),
            tool("t2", "a", "lookup_order", 22),
        ];
        let Converted::Trace { trace, nested, .. } = convert("t", &spans, &prices()) else {
            panic!()
        };
        assert_eq!(nested, 0);
        let steps = trace["steps"].as_array().unwrap();
        assert_eq!(steps.len(), 2, "{trace:#}");
        let call = &steps[1];
        assert_eq!(call["type"], "agent_call");
        assert_eq!(call["agent_id"], "refund-desk");
        assert_eq!(call["args"], json!({"q": 1}), "the tool's arguments");
        assert_eq!(call["metadata"]["tool_name"], "ask_refund_desk");
        assert_eq!(call["sub_trace"]["steps"][0]["name"], "lookup_order");
        assert!(call["started_at_ms"].as_f64().unwrap() <= call["ended_at_ms"].as_f64().unwrap());
    }

    #[test]
    fn a_model_call_inside_a_tool_is_named_and_its_tokens_count() {
        let spans = vec![
            agent("r", None, "boss", 0),
            tool("t", "r", "summarise", 1),
            chat("l", "t", 2, (10, 5)),
            // Two instrumentations of one client: the same call twice.
            chat("l2", "l", 3, (10, 5)),
        ];
        let Converted::Trace { trace, nested, .. } = convert("t", &spans, &prices()) else {
            panic!()
        };
        assert_eq!(nested, 2);
        assert_eq!(trace["steps"].as_array().unwrap().len(), 1, "{trace:#}");
        assert_eq!(trace["metadata"]["total_tokens"], 15, "counted once: {trace:#}");
        assert_eq!(trace["metadata"]["nested_spans"]["count"], 2);
    }

    #[test]
    fn each_trace_of_a_tree_counts_its_own_tokens_so_the_tree_sums_each_once() {
        let spans = vec![
            agent("r", None, "boss", 0),
            chat("l", "r", 1, (10, 0)),
            agent("a", Some("r"), "helper", 2),
            chat("l2", "a", 3, (20, 0)),
        ];
        let Converted::Trace { trace, .. } = convert("t", &spans, &prices()) else {
            panic!()
        };
        assert_eq!(trace["metadata"]["total_tokens"], 10, "{trace:#}");
        assert_eq!(trace["steps"][1]["sub_trace"]["metadata"]["total_tokens"], 20);
    }

    #[test]
    fn a_bare_tool_input_takes_the_model_calls_arguments_only_when_it_is_their_one_value() {
        let call = |args: &str| json!({"type": "llm_call", "name": "chat", "result": {"tool_calls": [{"id": "c1", "name": "t", "arguments": args}]}});
        let tool = |input: Value| json!({"type": "tool_call", "name": "t", "args": {"input": input}, "metadata": {}});
        for (input, args, want) in [
            (json!("ORD-7"), r#"{"order_id": "ORD-7"}"#, json!({"order_id": "ORD-7"})),
            (json!("7"), r#"{"n": 7}"#, json!({"n": 7})),
            // Another value, or two arguments: the span's own record stays.
            (json!(7), r#"{"n": 8}"#, json!({"input": 7})),
            (json!("ORD-7"), r#"{"a": "ORD-7", "b": 1}"#, json!({"input": "ORD-7"})),
        ] {
            let mut steps = vec![call(args), tool(input)];
            fill_tool_args(&mut steps);
            assert_eq!(steps[1]["args"], want, "{args}");
        }
    }

    #[test]
    fn a_trace_whose_model_calls_report_no_usage_has_no_token_count() {
        let spans = vec![
            agent("r", None, "boss", 0),
            span(
                "l",
                Some("r"),
                "chat",
                1,
                json!({"gen_ai.operation.name": "chat", "gen_ai.request.model": "m"}),
            ),
        ];
        let Converted::Trace { trace, .. } = convert("t", &spans, &prices()) else {
            panic!()
        };
        assert!(trace["metadata"].get("total_tokens").is_none(), "unknown, not 0: {trace:#}");
        assert_eq!(trace["steps"][0]["result"]["tokens"], Value::Null);
    }

    #[test]
    fn openllmetry_and_mlflow_span_shapes() {
        let traceloop = vec![
            span(
                "w",
                None,
                "refund.workflow",
                0,
                json!({"traceloop.span.kind": "workflow", "traceloop.entity.name": "refund"}),
            ),
            span(
                "a",
                Some("w"),
                "refund-agent.agent",
                1,
                json!({"traceloop.span.kind": "agent", "traceloop.entity.name": "refund-agent"}),
            ),
            span(
                "l",
                Some("a"),
                "openai.chat",
                2,
                json!({"gen_ai.system": "openai", "gen_ai.request.model": "gpt-4o", "gen_ai.usage.prompt_tokens": 7, "gen_ai.usage.completion_tokens": 3}),
            ),
            span(
                "t",
                Some("a"),
                "lookup_order.tool",
                3,
                json!({"traceloop.span.kind": "tool", "traceloop.entity.name": "lookup_order",
                       "traceloop.entity.input": "{\"args\": [], \"kwargs\": {\"order_id\": \"ORD-7\"}}",
                       "traceloop.entity.output": "{\"status\": \"delivered\"}"}),
            ),
        ];
        let Converted::Trace { trace, .. } = convert("t", &traceloop, &prices()) else {
            panic!()
        };
        assert_eq!(trace["agent_id"], "refund-agent", "{trace:#}");
        let steps = trace["steps"].as_array().unwrap();
        assert_eq!(steps.len(), 2, "{trace:#}");
        assert_eq!(steps[1]["name"], "lookup_order");
        assert_eq!(steps[1]["args"], json!({"order_id": "ORD-7"}));
        assert_eq!(steps[1]["result"], json!({"status": "delivered"}));
        assert_eq!(trace["metadata"]["total_tokens"], 10);

        let mlflow = vec![
            span("r", None, "Agent", 0, json!({"mlflow.spanType": "AGENT"})),
            span("c", Some("r"), "ChatModel", 1, json!({"mlflow.spanType": "CHAT_MODEL"})),
            span(
                "t",
                Some("r"),
                "lookup_order",
                2,
                json!({"mlflow.spanType": "TOOL", "mlflow.spanInputs": "{\"order_id\": \"ORD-7\"}", "mlflow.spanOutputs": "\"delivered\""}),
            ),
            span("d", Some("r"), "kb", 3, json!({"mlflow.spanType": "RETRIEVER"})),
        ];
        let Converted::Trace { trace, .. } = convert("t", &mlflow, &prices()) else {
            panic!()
        };
        let kinds: Vec<&str> = trace["steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["type"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["llm_call", "tool_call", "retrieval"], "{trace:#}");
        assert_eq!(trace["steps"][1]["args"], json!({"order_id": "ORD-7"}));
        assert_eq!(trace["steps"][1]["result"], json!({"output": "delivered"}));
    }

    #[test]
    fn genai_older_names_with_nested_agent() {
        let spans = vec![
            span(
                "r",
                None,
                "invoke_agent planner",
                0,
                json!({"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "planner"}),
            ),
            span(
                "l1",
                Some("r"),
                "chat gpt-4o",
                1,
                json!({
                    "gen_ai.system": "openai", "gen_ai.request.model": "gpt-4o-2024",
                    "gen_ai.usage.prompt_tokens": 100, "gen_ai.usage.completion_tokens": 50,
                    "gen_ai.prompt": "[{\"role\":\"user\",\"content\":\"plan a trip\"}]",
                    "gen_ai.completion": "[{\"role\":\"assistant\",\"content\":\"delegating\"}]"
                }),
            ),
            span(
                "a2",
                Some("r"),
                "invoke_agent booker",
                2,
                json!({"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "booker"}),
            ),
            span(
                "t1",
                Some("a2"),
                "execute_tool book",
                3,
                json!({"gen_ai.tool.name": "book", "gen_ai.tool.call.arguments": "{\"city\":\"Oslo\"}", "gen_ai.tool.call.result": "done"}),
            ),
        ];
        let Converted::Trace { trace, context, .. } = convert("t", &spans, &prices()) else {
            panic!("not converted")
        };
        assert_eq!(trace["agent_id"], "planner");
        assert_eq!(context.agent_id.as_deref(), Some("planner"));
        assert_eq!(trace["input"]["user_message"], "plan a trip");
        assert_eq!(trace["output"]["message"], "delegating");
        assert_eq!(trace["steps"][0]["type"], "llm_call");
        assert_eq!(trace["steps"][0]["args"]["model"], "gpt-4o-2024");
        assert_eq!(trace["steps"][1]["type"], "agent_call");
        let sub = &trace["steps"][1]["sub_trace"];
        assert_eq!(sub["steps"][0]["name"], "book");
        assert_eq!(sub["steps"][0]["args"]["city"], "Oslo");
        assert_eq!(sub["steps"][0]["result"]["output"], "done");
        assert_eq!(trace["metadata"]["total_tokens"], 150);
        assert_eq!(trace["metadata"]["cost_usd"], json!(0.0002));
    }

    #[test]
    fn openinference_retriever_and_root_io() {
        let spans = vec![
            span(
                "r",
                None,
                "rag",
                0,
                json!({"openinference.span.kind": "CHAIN", "input.value": "q?", "output.value": "a!"}),
            ),
            span(
                "x",
                Some("r"),
                "retrieve",
                1,
                json!({
                    "openinference.span.kind": "RETRIEVER", "input.value": "q?",
                    "retrieval.documents.0.document.id": "d1", "retrieval.documents.0.document.content": "text", "retrieval.documents.0.document.score": 0.5
                }),
            ),
            span(
                "l",
                Some("r"),
                "ChatCompletion",
                2,
                json!({
                    "openinference.span.kind": "LLM", "llm.model_name": "m",
                    "llm.token_count.prompt": 3, "llm.token_count.completion": 4,
                    "llm.output_messages.0.message.role": "assistant", "llm.output_messages.0.message.content": "a!"
                }),
            ),
        ];
        let Converted::Trace { trace, .. } = convert("t", &spans, &PriceTable::default()) else {
            panic!()
        };
        assert_eq!(trace["input"]["user_message"], "q?");
        assert_eq!(trace["output"]["message"], "a!");
        assert_eq!(trace["steps"][0]["type"], "retrieval");
        assert_eq!(trace["steps"][0]["result"]["documents"][0]["id"], "d1");
        assert_eq!(trace["steps"][1]["result"]["tokens"], 7);
        assert!(trace.get("agent_id").is_none());
        assert!(trace["metadata"].get("cost_usd").is_none(), "no price, no cost");
    }

    #[test]
    fn openinference_messages_sent_as_parts_keep_their_text() {
        let spans = vec![span(
            "l",
            None,
            "ChatCompletion",
            1,
            json!({
                "openinference.span.kind": "LLM",
                "llm.input_messages.0.message.role": "user",
                "llm.input_messages.0.message.contents.0.message_content.type": "text",
                "llm.input_messages.0.message.contents.0.message_content.text": "Where is my refund?",
                "llm.input_messages.0.message.contents.1.message_content.type": "image",
                "llm.input_messages.0.message.contents.1.message_content.image.image.url": "https://example.com/receipt.png",
                "llm.input_messages.0.message.contents.2.message_content.type": "text",
                "llm.input_messages.0.message.contents.2.message_content.text": "Order 42.",
                "llm.output_messages.0.message.contents.0.message_content.type": "text",
                "llm.output_messages.0.message.contents.0.message_content.text": "Refunded.",
            }),
        )];
        let Converted::Trace { trace, .. } = convert("t", &spans, &PriceTable::default()) else {
            panic!()
        };
        assert_eq!(trace["input"]["user_message"], "Where is my refund?\nOrder 42.");
        assert_eq!(trace["output"]["message"], "Refunded.");
        let messages = &trace["steps"][0]["args"]["messages"];
        assert_eq!(messages[0]["role"], "user", "{trace}");
        assert_eq!(messages[0]["content"], "Where is my refund?\nOrder 42.");
    }

    #[test]
    fn duplicate_span_ids_and_cycles_do_not_multiply_steps() {
        let mut spans = vec![span(
            "x",
            None,
            "invoke_agent a",
            0,
            json!({"gen_ai.operation.name": "invoke_agent"}),
        )];
        for i in 0..2_000 {
            spans.push(span("x", Some("x"), "step", i + 1, json!({"gen_ai.tool.name": "t"})));
            spans.push(span("x", Some("x"), "wrapper", i + 1, json!({"http.method": "GET"})));
        }
        // Every span is its own parent's child here; without the visited set the
        // walk would revisit all 4,000 spans at each of 256 levels.
        let Converted::Trace { trace, .. } = convert("t", &spans, &PriceTable::default()) else {
            panic!()
        };
        assert_eq!(trace["steps"].as_array().unwrap().len(), 2_000, "each tool span once");
    }

    #[test]
    fn no_root_and_unknown_convention() {
        let orphan = vec![span("a", Some("zz"), "x", 0, json!({"openinference.span.kind": "LLM"}))];
        assert!(matches!(convert("t", &orphan, &PriceTable::default()), Converted::NoRoot));
        let http = vec![span("a", None, "GET /", 0, json!({"http.method": "GET"}))];
        assert!(matches!(convert("t", &http, &PriceTable::default()), Converted::UnknownConvention));
    }

    #[test]
    fn a_span_with_a_remote_parent_is_the_root_when_no_span_lacks_a_parent() {
        let agent = json!({"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "refund-agent"});
        let mut server = span("s", Some("gateway"), "POST /chat", 0, json!({"http.method": "POST"}));
        server.parent_is_remote = true;
        let spans = vec![
            server.clone(),
            span("a", Some("s"), "invoke_agent refund-agent", 1, agent.clone()),
            span("t", Some("a"), "execute_tool", 2, json!({"gen_ai.tool.name": "lookup_order"})),
        ];
        let Converted::Trace { trace, unreachable, .. } = convert("t", &spans, &prices()) else {
            panic!("not converted")
        };
        assert_eq!((trace["agent_id"].as_str(), unreachable), (Some("refund-agent"), 0));
        assert_eq!(trace["metadata"]["root_span"], "POST /chat");
        assert_eq!(trace["steps"][0]["name"], "lookup_order");
        // When the caller's spans come here too, the caller's root is the root.
        let mut with_caller = spans.clone();
        with_caller.push(span("gateway", None, "GET /gateway", 0, json!({})));
        let Converted::Trace { trace, .. } = convert("t", &with_caller, &prices()) else {
            panic!("not converted")
        };
        assert_eq!(trace["metadata"]["root_span"], "GET /gateway");
        // A missing parent without the remote flag is no root.
        server.parent_is_remote = false;
        assert!(matches!(convert("t", &[server], &prices()), Converted::NoRoot));
    }

    #[test]
    fn spans_cut_off_from_the_root_are_counted() {
        let spans = vec![
            span("r", None, "invoke_agent a", 0, json!({"gen_ai.operation.name": "invoke_agent"})),
            span("t1", Some("r"), "execute_tool", 1, json!({"gen_ai.tool.name": "kept"})),
            // Their parent "m" never arrived.
            span("t2", Some("m"), "execute_tool", 2, json!({"gen_ai.tool.name": "lost"})),
            span("t3", Some("t2"), "execute_tool", 3, json!({"gen_ai.tool.name": "lost too"})),
        ];
        let Converted::Trace { trace, unreachable, .. } = convert("t", &spans, &prices()) else {
            panic!("not converted")
        };
        assert_eq!(unreachable, 2);
        assert_eq!(trace["steps"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn an_openinference_agent_without_a_name_attribute_is_named_by_its_span() {
        let spans = vec![
            span(
                "r",
                None,
                "refund-agent",
                0,
                json!({"openinference.span.kind": "AGENT", "input.value": "q"}),
            ),
            span(
                "t",
                Some("r"),
                "lookup",
                1,
                json!({"openinference.span.kind": "TOOL", "tool.name": "lookup_order"}),
            ),
        ];
        let Converted::Trace { trace, context, .. } = convert("t", &spans, &prices()) else {
            panic!("not converted")
        };
        assert_eq!(trace["agent_id"], "refund-agent");
        assert_eq!(context.agent_id.as_deref(), Some("refund-agent"));
        // An `agent.name` attribute still wins.
        let mut named = spans.clone();
        named[0].attributes.insert("agent.name".into(), json!("named"));
        let Converted::Trace { trace, .. } = convert("t", &named, &prices()) else {
            panic!("not converted")
        };
        assert_eq!(trace["agent_id"], "named");
    }
}
