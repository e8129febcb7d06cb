//! The engine's providers, as plugins reach them (`models.embed` and
//! `models.judge` of `attest:plugin@0.2.0`): the same embedder, judge,
//! cache, retries and prices as layers 5 and 6.

use crate::plugins::capabilities::{Embeddings, JudgeRequest, Judgement, Models};
use crate::providers::llm_judge::{JudgeCheck, Shown};
use crate::providers::Providers;
use attest_core::backends::{BoxFuture, ProviderError};
use std::sync::Arc;
use tokio::time::Instant;

pub struct ProviderModels(pub Arc<Providers>);

impl Models for ProviderModels {
    fn embed(&self, texts: Vec<String>, deadline: Instant) -> BoxFuture<'static, Result<Embeddings, ProviderError>> {
        let providers = self.0.clone();
        Box::pin(async move {
            let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
            let embedded = providers.embed(&refs, None, deadline).await?;
            Ok(Embeddings {
                vectors: embedded.vectors,
                cost: embedded.cost,
            })
        })
    }

    fn judge(&self, request: JudgeRequest, deadline: Instant) -> BoxFuture<'static, Result<Judgement, ProviderError>> {
        let providers = self.0.clone();
        Box::pin(async move {
            let judge = providers.judge()?;
            let examples: Vec<(String, f64, String)> = request.examples.into_iter().map(|e| (e.content, e.score, e.reasoning)).collect();
            let check = JudgeCheck::for_plugin(&request.rubric, &examples);
            let shown = Shown {
                output: &request.content,
                input: "",
                context: request.context.as_deref().unwrap_or(""),
            };
            let judged = check.judge_material(&providers, judge, &shown, deadline).await?;
            Ok(Judgement {
                score: judged.verdict.score,
                reasoning: judged.verdict.explanation,
                cost: judged.cost,
                cached: judged.cached,
            })
        })
    }
}
