//! What a call is charged: the server's own counts when it reports them, else the route's
//! tokenizer (a vLLM or llama.cpp server), else a generous estimate over everything the call
//! sent (`tollgate_router::tokens::estimate_call`) and everything that came back.

use tollgate_router::config::Route;
use tollgate_router::tokens::{estimate_call, estimate_completion, TokenCount, TokenSource};
use tollgate_router::wire::ChatRequest;
use tollgate_router_backends::{has_tokenizer, ModelRoutes};

use super::relay::Streamed;
use super::ModelCalls;

impl ModelCalls {
    /// The prompt's tokens: the route's tokenizer when its server has one (the call is sent
    /// to it as it would be to the route: it is the same local server); an estimate over
    /// the whole call otherwise, or when the tokenizer fails. A tokenizer never fails the
    /// call.
    pub(super) async fn prompt_tokens(
        &self,
        shared: &ModelRoutes,
        route: &Route,
        chat: &ChatRequest,
    ) -> TokenCount {
        if !has_tokenizer(route) {
            return estimate_call(&chat.call);
        }
        match shared.backends.count_prompt(route, chat).await {
            Ok(tokens) => TokenCount {
                tokens,
                source: TokenSource::Tokenizer,
            },
            Err(e) => {
                tracing::warn!(run_id = %self.gate.run_id, route = %route.name, error = %e, "estimating the prompt's tokens instead");
                estimate_call(&chat.call)
            }
        }
    }

    /// What the call is charged: the server's counts, else the tokenizer's, else estimates
    /// (see [`Self::completion_tokens`]).
    pub(super) async fn counts(
        &self,
        shared: &ModelRoutes,
        route: &Route,
        planned: (TokenCount, u32),
        streamed: &Streamed,
    ) -> (TokenCount, TokenCount) {
        let (planned_prompt, max_tokens) = planned;
        let Streamed {
            result,
            text_len,
            text,
            prompt: server_prompt,
            completion: server_completion,
            ..
        } = streamed;
        let text_len = *text_len;
        let prompt = server_prompt.map_or(planned_prompt, |tokens| TokenCount {
            tokens,
            source: TokenSource::Server,
        });
        let completion = match *server_completion {
            Some(tokens) => TokenCount {
                tokens,
                source: TokenSource::Server,
            },
            None => {
                // The tokenizer counts only a whole reply of text alone that went through.
                let whole = result.is_ok() && text.len() == text_len;
                self.completion_tokens(shared, route, whole.then_some(text.as_str()))
                    .await
                    .unwrap_or_else(|| {
                        // Uncounted: charged the cap the backend was held to (never less
                        // than the reply's length suggests), so estimates cannot add up
                        // past the budget.
                        let mut estimate = estimate_completion(text);
                        estimate.tokens = estimate
                            .tokens
                            .max((text_len as u64).div_ceil(4))
                            .max(u64::from(max_tokens));
                        estimate
                    })
            }
        };
        // A failed call that returned nothing is not charged (an agent's retry of an
        // unreachable backend must not drain its budget).
        if result.is_err() && text_len == 0 {
            (
                TokenCount {
                    tokens: 0,
                    ..prompt
                },
                TokenCount {
                    tokens: 0,
                    ..completion
                },
            )
        } else {
            (prompt, completion)
        }
    }

    /// The completion's tokens by the route's tokenizer, when it has one and the whole text
    /// came back; `None`: estimate instead.
    async fn completion_tokens(
        &self,
        shared: &ModelRoutes,
        route: &Route,
        text: Option<&str>,
    ) -> Option<TokenCount> {
        let text = text.filter(|_| has_tokenizer(route))?;
        match shared.backends.count_completion(route, text).await {
            Ok(tokens) => Some(TokenCount {
                tokens,
                source: TokenSource::Tokenizer,
            }),
            Err(e) => {
                tracing::warn!(run_id = %self.gate.run_id, route = %route.name, error = %e, "estimating the completion's tokens instead");
                None
            }
        }
    }
}
