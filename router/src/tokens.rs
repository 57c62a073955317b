//! A run's token budget (`Limits.tokens`): calls reserve before they reach a backend and
//! settle with what they really used.
//!
//! A call reserves its prompt (a tokenizer's count, or the generous [`estimate_call`])
//! plus the completion it may produce; the completion cap sent to the backend is lowered to
//! what is left, so a completion cannot overshoot. When even the prompt does not fit, the
//! call is refused before any backend is contacted. Settling replaces the reservation with
//! the counts the call really used (the server's, a tokenizer's, or an estimate, each
//! flagged by its [`TokenSource`]). A run can go past its limit only by one prompt
//! estimate's error, and only on a route with neither a tokenizer nor usage in its replies;
//! later calls are then refused.

use tollgate_proto::v1 as pb;

/// Where a token count comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenSource {
    /// The backend's own usage report.
    Server,
    /// The backend's tokenizer endpoint.
    Tokenizer,
    /// An estimate from the text's length.
    Estimate,
}

/// A token count and where it comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenCount {
    /// Tokens.
    pub tokens: u64,
    /// Its source.
    pub source: TokenSource,
}

/// Tokens an image is estimated at, whatever its size: about what the largest image the
/// APIs accept without scaling costs (Anthropic: about 1 600 for 1.15 megapixels; OpenAI:
/// 1 105 for a 2048 x 768 image at high detail).
pub const IMAGE_TOKENS: u64 = 1600;
/// Tokens of a chat template's framing around each message, tool definition, call and
/// result.
const FRAMING_TOKENS: u64 = 4;

/// Tokens `text` is estimated at: generous, about 3 bytes a token (English runs about 4).
fn text_tokens(text: &str) -> u64 {
    (text.len() as u64).div_ceil(3)
}

/// A generous estimate of the prompt tokens of everything `call` sends: message texts, tool
/// definitions (names, descriptions, schemas), tool calls (names, ids, arguments), tool
/// results, thinking sent back (its text and its signature or encrypted data), the response
/// format, stop sequences, each image at [`IMAGE_TOKENS`], and a few tokens of framing for
/// each message, tool, call and result.
pub fn estimate_call(call: &pb::CompleteRequest) -> TokenCount {
    let mut tokens = 3;
    for message in &call.messages {
        tokens += FRAMING_TOKENS + text_tokens(&message.content) + parts_tokens(&message.parts);
    }
    for tool in &call.tools {
        tokens += FRAMING_TOKENS
            + text_tokens(&tool.name)
            + text_tokens(&tool.description)
            + text_tokens(&tool.parameters_json);
    }
    tokens += text_tokens(&call.response_format_json);
    tokens += call.stop.iter().map(|s| text_tokens(s)).sum::<u64>();
    TokenCount {
        tokens,
        source: TokenSource::Estimate,
    }
}

fn parts_tokens(parts: &[pb::ContentPart]) -> u64 {
    use pb::content_part::Part;
    parts
        .iter()
        .map(|part| match &part.part {
            Some(Part::Text(text)) => text_tokens(text),
            Some(Part::Image(_)) => IMAGE_TOKENS,
            Some(Part::ToolCall(call)) => {
                FRAMING_TOKENS
                    + text_tokens(&call.id)
                    + text_tokens(&call.name)
                    + text_tokens(&call.arguments_json)
            }
            Some(Part::ToolResult(result)) => {
                FRAMING_TOKENS + text_tokens(&result.call_id) + parts_tokens(&result.content)
            }
            Some(Part::Thinking(thinking)) => {
                text_tokens(&thinking.text) + text_tokens(&thinking.signature)
            }
            None => 0,
        })
        .sum()
}

/// An estimate of a completion's tokens from its text.
pub fn estimate_completion(text: &str) -> TokenCount {
    TokenCount {
        tokens: (text.len() as u64).div_ceil(4),
        source: TokenSource::Estimate,
    }
}

/// The budget is spent (or this prompt alone would spend it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the token budget is spent (used {used} of {limit}, {reserved} held by calls in flight; this prompt needs about {needs})")]
pub struct BudgetSpent {
    /// Tokens used by settled calls.
    pub used: u64,
    /// Tokens held by calls in flight.
    pub reserved: u64,
    /// The run's limit.
    pub limit: u64,
    /// What this call's prompt needs.
    pub needs: u64,
}

/// Tokens held for one call in flight.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a reservation is settled or released"]
pub struct Reservation {
    held: u64,
    /// The completion cap to send to the backend.
    pub max_tokens: u32,
}

/// One run's budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ledger {
    limit: u64,
    used: u64,
    reserved: u64,
}

impl Ledger {
    /// A budget of `limit` tokens, none used.
    pub fn new(limit: u64) -> Self {
        Self {
            limit,
            used: 0,
            reserved: 0,
        }
    }

    /// Tokens used by settled calls.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Counts `used` tokens as already spent: a run re-adopted after a supervisor restart
    /// keeps the budget it had left.
    pub fn restore_used(&mut self, used: u64) {
        self.used = used;
    }

    /// The budget in all.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Lowers the budget to `limit` (never raises it): what is used stays used, calls in
    /// flight keep what they hold, and a budget at or below that refuses every further call.
    pub fn lower_to(&mut self, limit: u64) {
        self.limit = self.limit.min(limit);
    }

    /// Raises the budget to `limit` (never lowers it): a signed amendment.
    pub fn raise_to(&mut self, limit: u64) {
        self.limit = self.limit.max(limit);
    }

    /// Sets the budget to `limit`: what a re-adopted run's amendments had made of it.
    pub fn set_limit(&mut self, limit: u64) {
        self.limit = limit;
    }

    /// Tokens neither used nor held.
    pub fn remaining(&self) -> u64 {
        self.limit
            .saturating_sub(self.used.saturating_add(self.reserved))
    }

    /// Holds `prompt` plus up to `max_tokens` completion tokens, lowering the completion
    /// cap to what is left; refused when not even the prompt and one token fit.
    pub fn reserve(&mut self, prompt: u64, max_tokens: u32) -> Result<Reservation, BudgetSpent> {
        let remaining = self.remaining();
        if prompt.saturating_add(1) > remaining {
            return Err(BudgetSpent {
                used: self.used,
                reserved: self.reserved,
                limit: self.limit,
                needs: prompt,
            });
        }
        let completion = u64::from(max_tokens).min(remaining - prompt);
        let held = prompt + completion;
        self.reserved = self.reserved.saturating_add(held);
        Ok(Reservation {
            held,
            max_tokens: u32::try_from(completion).unwrap_or(u32::MAX),
        })
    }

    /// Replaces a reservation with what the call used; returns the run's total used.
    pub fn settle(&mut self, reservation: Reservation, prompt: u64, completion: u64) -> u64 {
        self.reserved = self.reserved.saturating_sub(reservation.held);
        self.used = self.used.saturating_add(prompt).saturating_add(completion);
        self.used
    }

    /// Gives a reservation back unused (the call was not made).
    pub fn release(&mut self, reservation: Reservation) {
        self.reserved = self.reserved.saturating_sub(reservation.held);
    }

    /// Hands `tokens` on to a child run (delegation): they count as used here from now on,
    /// so a parent and its children together never spend more than the parent's limit.
    /// Refused (nothing changes) when fewer are left.
    pub fn transfer(&mut self, tokens: u64) -> Result<(), BudgetSpent> {
        if tokens > self.remaining() {
            return Err(BudgetSpent {
                used: self.used,
                reserved: self.reserved,
                limit: self.limit,
                needs: tokens,
            });
        }
        self.used += tokens;
        Ok(())
    }

    /// Takes back tokens handed on by [`Self::transfer`] for a child that was never minted.
    pub fn refund(&mut self, tokens: u64) {
        self.used = self.used.saturating_sub(tokens);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lowered_budget_keeps_what_was_used_and_never_rises() {
        let mut ledger = Ledger::new(100);
        let held = ledger.reserve(10, 20).unwrap();
        ledger.settle(held, 10, 20);
        ledger.lower_to(40);
        assert_eq!((ledger.limit(), ledger.remaining()), (40, 10));
        ledger.lower_to(500);
        assert_eq!(ledger.limit(), 40, "a narrowing never raises the budget");
        ledger.lower_to(25);
        assert!(ledger.reserve(1, 1).is_err(), "below what was used: spent");
    }

    #[test]
    fn reservations_lower_the_cap_then_settle_to_what_was_used() {
        let mut ledger = Ledger::new(100);
        let first = ledger.reserve(20, 1000).unwrap();
        assert_eq!(first.max_tokens, 80, "lowered to what is left");
        assert_eq!(ledger.remaining(), 0);
        // A concurrent call finds nothing left.
        let refused = ledger.reserve(5, 10).unwrap_err();
        assert_eq!((refused.reserved, refused.needs), (100, 5));
        assert_eq!(ledger.settle(first, 18, 42), 60);
        assert_eq!(ledger.remaining(), 40);
        let second = ledger.reserve(30, 50).unwrap();
        assert_eq!(second.max_tokens, 10);
        ledger.release(second);
        assert_eq!(ledger.remaining(), 40);
        // Not even the prompt and one token: refused before any backend is asked.
        assert!(ledger.reserve(40, 10).is_err());
        assert!(ledger.reserve(39, 10).is_ok());
    }

    #[test]
    fn estimates_are_generous_and_flagged() {
        let message = |content: &str| pb::ChatMessage {
            role: "user".into(),
            content: content.into(),
            parts: Vec::new(),
        };
        let call = pb::CompleteRequest {
            messages: vec![message("abcdef"), message("xyz")],
            ..Default::default()
        };
        let prompt = estimate_call(&call);
        assert_eq!(prompt.tokens, 2 + 1 + 8 + 3);
        assert_eq!(prompt.source, TokenSource::Estimate);
        assert_eq!(estimate_completion("hello world").tokens, 3);
    }

    #[test]
    fn transfers_and_refunds_keep_used_and_reserved_within_the_limit() {
        let mut ledger = Ledger::new(100);
        let held = ledger.reserve(10, 30).unwrap();
        assert!(ledger.transfer(61).is_err(), "only 60 are left");
        assert_eq!(ledger.remaining(), 60);
        ledger.transfer(60).unwrap();
        assert_eq!(ledger.remaining(), 0);
        assert!(ledger.reserve(0, 1).is_err());
        ledger.refund(20);
        assert_eq!(ledger.remaining(), 20);
        ledger.release(held);
        assert_eq!((ledger.used(), ledger.remaining()), (40, 60));
    }

    #[test]
    fn estimates_count_everything_that_leaves() {
        use pb::content_part::Part;
        let part = |part: Part| pb::ContentPart {
            part: Some(part),
            cache: false,
        };
        let text_only = pb::CompleteRequest {
            messages: vec![pb::ChatMessage {
                role: "user".into(),
                content: "abc".into(),
                parts: Vec::new(),
            }],
            ..Default::default()
        };
        let base = estimate_call(&text_only).tokens;
        assert_eq!(base, 1 + 4 + 3);
        let mut call = text_only.clone();
        call.tools.push(pb::ToolDefinition {
            name: "abc".into(),
            description: "abcdef".into(),
            parameters_json: "{}".into(),
            ..Default::default()
        });
        assert_eq!(estimate_call(&call).tokens, base + 4 + 1 + 2 + 1);
        call.messages[0].parts = vec![
            part(Part::Image(pb::ImagePart::default())),
            part(Part::ToolCall(pb::ToolCall {
                id: "abc".into(),
                name: "abc".into(),
                arguments_json: "{\"a\":1}".into(),
            })),
            part(Part::ToolResult(pb::ToolResult {
                call_id: "abc".into(),
                content: vec![
                    part(Part::Text("abcabc".into())),
                    part(Part::Image(pb::ImagePart::default())),
                ],
                is_error: false,
            })),
            part(Part::Thinking(pb::ThinkingPart {
                text: "abc".into(),
                signature: "abcabcabc".into(),
                ..Default::default()
            })),
        ];
        let image = IMAGE_TOKENS;
        assert_eq!(
            estimate_call(&call).tokens,
            base + 4 + 1 + 2 + 1 // the tool
                + image
                + 4 + 1 + 1 + 3 // the call
                + 4 + 1 + 2 + image // the result
                + 1 + 3 // the thinking
        );
    }
}
