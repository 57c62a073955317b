//! The three APIs' shapes for the scripted model server: reading what an agent sent (its tools,
//! its tool results, what is new since the model's last turn) and writing replies — whole, or
//! streamed as server-sent events in the order and shape each vendor streams them.

use std::hash::BuildHasher as _;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{json, Value};

use crate::scripted_models::script::Reply;

/// Which API a request speaks, by its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Api {
    /// OpenAI Chat Completions.
    Chat,
    /// The OpenAI Responses API.
    Responses,
    /// Anthropic Messages.
    Messages,
}

impl Api {
    /// The API a model request's path speaks (`None`: not a model request).
    pub(super) fn of_path(path: &str) -> Option<Self> {
        match path {
            "/v1/chat/completions" | "/chat/completions" => Some(Self::Chat),
            "/v1/responses" | "/responses" => Some(Self::Responses),
            "/v1/messages" => Some(Self::Messages),
            _ => None,
        }
    }
}

/// The answer to one request: status, content type, body (errors add `x-should-retry: false`).
pub(super) struct Answer {
    pub(super) status: u16,
    pub(super) content_type: &'static str,
    pub(super) body: String,
}

impl Answer {
    pub(super) fn json(body: Value) -> Self {
        Self {
            status: 200,
            content_type: "application/json",
            body: body.to_string(),
        }
    }
}

/// `n` letters and digits, random enough that no two ids of a run collide.
fn random_alnum(n: usize) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut out = String::with_capacity(n);
    while out.len() < n {
        // A fresh RandomState is randomly keyed: hashing a counter with it gives fresh bits.
        let mut bits = std::collections::hash_map::RandomState::new()
            .hash_one(COUNTER.fetch_add(1, Ordering::Relaxed));
        for _ in 0..10 {
            if out.len() == n {
                break;
            }
            out.push(ALPHABET[(bits % 62) as usize] as char);
            bits /= 62;
        }
    }
    out
}

/// `n` lowercase hex digits.
fn random_hex(n: usize) -> String {
    random_alnum(n)
        .bytes()
        .map(|b| char::from_digit(u32::from(b) % 16, 16).unwrap())
        .collect()
}

/// The ids of one tool call, in the vendor's style.
#[derive(Debug, Clone)]
pub(super) struct CallIds {
    /// The id results refer to: `call_…` (OpenAI) or `toolu_…` (Anthropic).
    pub(super) call_id: String,
    /// The Responses API's output item id, `fc_…` (empty for the others).
    pub(super) item_id: String,
}

impl CallIds {
    /// Fresh ids for a call in `api`.
    pub(super) fn new(api: Api) -> Self {
        match api {
            Api::Chat => Self {
                call_id: format!("call_{}", random_alnum(24)),
                item_id: String::new(),
            },
            Api::Responses => Self {
                call_id: format!("call_{}", random_alnum(24)),
                item_id: format!("fc_{}", random_hex(48)),
            },
            Api::Messages => Self {
                call_id: format!("toolu_01{}", random_alnum(22)),
                item_id: String::new(),
            },
        }
    }
}

/// The text of a message's or a result's content: a string, or the `text` of its parts.
pub(super) fn content_text(content: &Value) -> String {
    match content {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts
            .iter()
            .map(|part| match part {
                Value::String(text) => text.clone(),
                _ => match part.get("text") {
                    Some(Value::String(text)) => text.clone(),
                    _ => content_text(part.get("content").unwrap_or(&Value::Null)),
                },
            })
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// The conversation items of a request: chat `messages`, Messages `messages`, Responses `input`.
pub(super) fn items(api: Api, body: &Value) -> Vec<Value> {
    let field = match api {
        Api::Chat | Api::Messages => &body["messages"],
        Api::Responses => &body["input"],
    };
    match field {
        Value::Array(items) => items.clone(),
        Value::Null => Vec::new(),
        other => vec![json!({"role": "user", "content": other})],
    }
}

/// The names of the tools a request declares (a Responses built-in tool by its type; the
/// tools of a Responses `namespace`, and of `additional_tools` input items, by their own names).
pub(super) fn tool_names(api: Api, body: &Value) -> Vec<String> {
    let mut names = Vec::new();
    let mut add = |tools: &Value| collect_tools(api, tools, &mut names);
    add(&body["tools"]);
    if api == Api::Responses {
        for item in items(api, body) {
            if item["type"] == "additional_tools" {
                add(&item["tools"]);
            }
        }
    }
    names
}

fn collect_tools(api: Api, tools: &Value, names: &mut Vec<String>) {
    for tool in tools.as_array().into_iter().flatten() {
        if api == Api::Responses && tool["type"] == "namespace" {
            collect_tools(api, &tool["tools"], names);
            continue;
        }
        let name = match api {
            Api::Chat => tool["function"]["name"].as_str(),
            Api::Messages => tool["name"].as_str(),
            Api::Responses => tool["name"].as_str().or(tool["type"].as_str()),
        };
        names.extend(name.map(str::to_owned));
    }
}

/// The tool results a request carries: (call id, text), in order.
pub(super) fn tool_results(api: Api, body: &Value) -> Vec<(String, String)> {
    let mut results = Vec::new();
    for item in items(api, body) {
        match api {
            Api::Chat if item["role"] == "tool" => results.push((
                item["tool_call_id"].as_str().unwrap_or_default().to_owned(),
                content_text(&item["content"]),
            )),
            Api::Responses
                if matches!(
                    item["type"].as_str(),
                    Some("function_call_output" | "custom_tool_call_output")
                ) =>
            {
                results.push((
                    item["call_id"].as_str().unwrap_or_default().to_owned(),
                    content_text(&item["output"]),
                ))
            }
            Api::Messages => {
                for block in item["content"].as_array().into_iter().flatten() {
                    if block["type"] == "tool_result" {
                        results.push((
                            block["tool_use_id"].as_str().unwrap_or_default().to_owned(),
                            content_text(&block["content"]),
                        ));
                    }
                }
            }
            _ => {}
        }
    }
    results
}

/// Whether an item is the model's own (an assistant message, a call it made, its reasoning).
fn is_models(api: Api, item: &Value) -> bool {
    item["role"] == "assistant"
        || (api == Api::Responses
            && matches!(
                item["type"].as_str(),
                Some("function_call" | "custom_tool_call" | "reasoning" | "local_shell_call")
            ))
}

/// The text of one item: its content, or a Responses tool output.
fn item_text(item: &Value) -> String {
    if let Some(output) = item.get("output") {
        return content_text(output);
    }
    content_text(&item["content"])
}

/// The text of everything after the model's last item.
pub(super) fn since_last_assistant(api: Api, body: &Value) -> String {
    let items = items(api, body);
    let start = items
        .iter()
        .rposition(|item| is_models(api, item))
        .map_or(0, |at| at + 1);
    items[start..]
        .iter()
        .map(item_text)
        .collect::<Vec<_>>()
        .join("\n")
}

/// The last item's text.
pub(super) fn last_text(api: Api, body: &Value) -> String {
    items(api, body).last().map(item_text).unwrap_or_default()
}

/// `GET /v1/models`, in Anthropic's shape to an Anthropic client, else OpenAI's.
pub(super) fn models(models: &[String], anthropic: bool) -> Value {
    if anthropic {
        json!({
            "data": models.iter().map(|m| json!({"type": "model", "id": m, "display_name": m, "created_at": "2025-01-01T00:00:00Z"})).collect::<Vec<_>>(),
            "has_more": false,
            "first_id": models.first(),
            "last_id": models.last(),
        })
    } else {
        json!({
            "object": "list",
            "data": models.iter().map(|m| json!({"id": m, "object": "model", "created": 1_735_689_600, "owned_by": "scripted"})).collect::<Vec<_>>(),
        })
    }
}

/// An error in the API's own shape (OpenAI's when unknown).
pub(super) fn error(api: Option<Api>, status: u16, message: &str) -> Answer {
    let body = match api {
        Some(Api::Messages) => {
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": message}})
        }
        _ => {
            json!({"error": {"message": message, "type": "invalid_request_error", "param": null, "code": null}})
        }
    };
    Answer {
        status,
        content_type: "application/json",
        body: body.to_string(),
    }
}

/// `text` in three pieces (fewer when short), split on character boundaries.
fn pieces(text: &str) -> Vec<&str> {
    let chars: Vec<usize> = text.char_indices().map(|(at, _)| at).collect();
    if chars.len() < 3 {
        return vec![text];
    }
    let (a, b) = (chars[chars.len() / 3], chars[2 * chars.len() / 3]);
    vec![&text[..a], &text[a..b], &text[b..]]
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Tokens to report: about four bytes a token, at least one.
fn tokens(text: &str) -> u64 {
    (text.len() as u64 / 4).max(1)
}

/// The reply to a model request, whole or streamed.
pub(super) fn reply(
    api: Api,
    request: &Value,
    model: &str,
    reply: &Reply,
    ids: &[CallIds],
) -> Answer {
    let stream = request["stream"].as_bool() == Some(true);
    let input = tokens(&request.to_string());
    let output = match reply {
        Reply::Text(text) => tokens(text),
        Reply::Calls(calls) => calls.iter().map(|c| tokens(&c.arguments.to_string())).sum(),
    };
    let include_usage = request["stream_options"]["include_usage"].as_bool() == Some(true);
    let (content_type, body) = match (api, stream) {
        (Api::Chat, false) => (
            "application/json",
            chat_whole(model, reply, ids, input, output),
        ),
        (Api::Chat, true) => (
            "text/event-stream",
            chat_stream(model, reply, ids, include_usage.then_some((input, output))),
        ),
        (Api::Messages, false) => (
            "application/json",
            messages_whole(model, reply, ids, input, output),
        ),
        (Api::Messages, true) => (
            "text/event-stream",
            messages_stream(model, reply, ids, input, output),
        ),
        (Api::Responses, false) => (
            "application/json",
            responses_object(
                model,
                "completed",
                output_items(reply, ids),
                Some((input, output)),
            )
            .to_string(),
        ),
        (Api::Responses, true) => (
            "text/event-stream",
            responses_stream(model, reply, ids, input, output),
        ),
    };
    Answer {
        status: 200,
        content_type,
        body,
    }
}

// --- OpenAI Chat Completions ---

fn chat_whole(model: &str, reply: &Reply, ids: &[CallIds], input: u64, output: u64) -> String {
    let (message, finish) = match reply {
        Reply::Text(text) => (
            json!({"role": "assistant", "content": text, "refusal": null}),
            "stop",
        ),
        Reply::Calls(calls) => (
            json!({
                "role": "assistant",
                "content": null,
                "refusal": null,
                "tool_calls": calls.iter().zip(ids).map(|(call, ids)| json!({
                    "id": ids.call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments.to_string()},
                })).collect::<Vec<_>>(),
            }),
            "tool_calls",
        ),
    };
    json!({
        "id": format!("chatcmpl-{}", random_alnum(29)),
        "object": "chat.completion",
        "created": now(),
        "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": finish}],
        "usage": {"prompt_tokens": input, "completion_tokens": output, "total_tokens": input + output},
        "system_fingerprint": "fp_scripted",
    })
    .to_string()
}

fn chat_stream(model: &str, reply: &Reply, ids: &[CallIds], usage: Option<(u64, u64)>) -> String {
    let id = format!("chatcmpl-{}", random_alnum(29));
    let created = now();
    let chunk = |delta: Value, finish: Value| {
        let chunk = json!({
            "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
            "system_fingerprint": "fp_scripted",
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
        });
        format!("data: {chunk}\n\n")
    };
    let mut out = String::new();
    let finish = match reply {
        Reply::Text(text) => {
            out.push_str(&chunk(
                json!({"role": "assistant", "content": "", "refusal": null}),
                Value::Null,
            ));
            for piece in pieces(text) {
                out.push_str(&chunk(json!({"content": piece}), Value::Null));
            }
            "stop"
        }
        Reply::Calls(calls) => {
            for (index, (call, ids)) in calls.iter().zip(ids).enumerate() {
                let head = json!({"index": index, "id": ids.call_id, "type": "function",
                                  "function": {"name": call.name, "arguments": ""}});
                let delta = if index == 0 {
                    json!({"role": "assistant", "content": null, "tool_calls": [head], "refusal": null})
                } else {
                    json!({"tool_calls": [head]})
                };
                out.push_str(&chunk(delta, Value::Null));
                for piece in pieces(&call.arguments.to_string()) {
                    out.push_str(&chunk(
                        json!({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}),
                        Value::Null,
                    ));
                }
            }
            "tool_calls"
        }
    };
    out.push_str(&chunk(json!({}), json!(finish)));
    if let Some((input, output)) = usage {
        let last = json!({
            "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
            "system_fingerprint": "fp_scripted", "choices": [],
            "usage": {"prompt_tokens": input, "completion_tokens": output, "total_tokens": input + output},
        });
        out.push_str(&format!("data: {last}\n\n"));
    }
    out.push_str("data: [DONE]\n\n");
    out
}

// --- Anthropic Messages ---

fn messages_whole(model: &str, reply: &Reply, ids: &[CallIds], input: u64, output: u64) -> String {
    let (content, stop) = match reply {
        Reply::Text(text) => (vec![json!({"type": "text", "text": text})], "end_turn"),
        Reply::Calls(calls) => (
            calls
                .iter()
                .zip(ids)
                .map(|(call, ids)| json!({"type": "tool_use", "id": ids.call_id, "name": call.name, "input": call.arguments}))
                .collect(),
            "tool_use",
        ),
    };
    json!({
        "id": format!("msg_01{}", random_alnum(22)),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": null,
        "usage": {"input_tokens": input, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": output},
    })
    .to_string()
}

fn messages_stream(model: &str, reply: &Reply, ids: &[CallIds], input: u64, output: u64) -> String {
    let event = |data: Value| {
        format!(
            "event: {}\ndata: {data}\n\n",
            data["type"].as_str().unwrap()
        )
    };
    let mut out = event(json!({"type": "message_start", "message": {
        "id": format!("msg_01{}", random_alnum(22)), "type": "message", "role": "assistant",
        "model": model, "content": [], "stop_reason": null, "stop_sequence": null,
        "usage": {"input_tokens": input, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 1},
    }}));
    let stop = match reply {
        Reply::Text(text) => {
            out.push_str(&event(json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})));
            out.push_str(&event(json!({"type": "ping"})));
            for piece in pieces(text) {
                out.push_str(&event(json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}})));
            }
            out.push_str(&event(json!({"type": "content_block_stop", "index": 0})));
            "end_turn"
        }
        Reply::Calls(calls) => {
            for (index, (call, ids)) in calls.iter().zip(ids).enumerate() {
                out.push_str(&event(json!({"type": "content_block_start", "index": index,
                    "content_block": {"type": "tool_use", "id": ids.call_id, "name": call.name, "input": {}}})));
                if index == 0 {
                    out.push_str(&event(json!({"type": "ping"})));
                }
                out.push_str(&event(json!({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": ""}})));
                for piece in pieces(&call.arguments.to_string()) {
                    out.push_str(&event(json!({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": piece}})));
                }
                out.push_str(&event(
                    json!({"type": "content_block_stop", "index": index}),
                ));
            }
            "tool_use"
        }
    };
    out.push_str(&event(json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null}, "usage": {"output_tokens": output}})));
    out.push_str(&event(json!({"type": "message_stop"})));
    out
}

// --- OpenAI Responses ---

/// The output items of a reply; each item's id is its `fc_…` or a fresh `msg_…`.
fn output_items(reply: &Reply, ids: &[CallIds]) -> Vec<Value> {
    match reply {
        Reply::Text(text) => vec![json!({
            "type": "message", "id": format!("msg_{}", random_hex(48)), "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
        })],
        Reply::Calls(calls) => calls
            .iter()
            .zip(ids)
            .map(|(call, ids)| json!({
                "type": "function_call", "id": ids.item_id, "call_id": ids.call_id,
                "name": call.name, "arguments": call.arguments.to_string(), "status": "completed",
            }))
            .collect(),
    }
}

fn responses_object(
    model: &str,
    status: &str,
    output: Vec<Value>,
    usage: Option<(u64, u64)>,
) -> Value {
    json!({
        "id": format!("resp_{}", random_hex(48)),
        "object": "response",
        "created_at": now(),
        "status": status,
        "error": null,
        "incomplete_details": null,
        "instructions": null,
        "max_output_tokens": null,
        "model": model,
        "output": output,
        "parallel_tool_calls": true,
        "previous_response_id": null,
        "reasoning": {"effort": null, "summary": null},
        "store": false,
        "temperature": 1.0,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": usage.map(|(input, output)| json!({
            "input_tokens": input, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": output, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input + output,
        })),
        "user": null,
        "metadata": {},
    })
}

fn responses_stream(
    model: &str,
    reply: &Reply,
    ids: &[CallIds],
    input: u64,
    output: u64,
) -> String {
    let mut sequence = 0u64;
    let mut out = String::new();
    let mut event = |mut data: Value| {
        data["sequence_number"] = json!(sequence);
        sequence += 1;
        out.push_str(&format!(
            "event: {}\ndata: {data}\n\n",
            data["type"].as_str().unwrap()
        ));
    };
    let started = responses_object(model, "in_progress", Vec::new(), None);
    event(json!({"type": "response.created", "response": started}));
    event(json!({"type": "response.in_progress", "response": started}));
    let items = output_items(reply, ids);
    for (index, item) in items.iter().enumerate() {
        let id = item["id"].clone();
        if item["type"] == "function_call" {
            let mut added = item.clone();
            added["arguments"] = json!("");
            added["status"] = json!("in_progress");
            event(
                json!({"type": "response.output_item.added", "output_index": index, "item": added}),
            );
            let arguments = item["arguments"].as_str().unwrap();
            for piece in pieces(arguments) {
                event(
                    json!({"type": "response.function_call_arguments.delta", "item_id": id, "output_index": index, "delta": piece}),
                );
            }
            event(
                json!({"type": "response.function_call_arguments.done", "item_id": id, "output_index": index, "arguments": arguments}),
            );
        } else {
            let text = item["content"][0]["text"].as_str().unwrap();
            let mut added = item.clone();
            added["content"] = json!([]);
            added["status"] = json!("in_progress");
            event(
                json!({"type": "response.output_item.added", "output_index": index, "item": added}),
            );
            let empty =
                json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []});
            event(
                json!({"type": "response.content_part.added", "item_id": id, "output_index": index, "content_index": 0, "part": empty}),
            );
            for piece in pieces(text) {
                event(
                    json!({"type": "response.output_text.delta", "item_id": id, "output_index": index, "content_index": 0, "delta": piece, "logprobs": []}),
                );
            }
            event(
                json!({"type": "response.output_text.done", "item_id": id, "output_index": index, "content_index": 0, "text": text, "logprobs": []}),
            );
            event(
                json!({"type": "response.content_part.done", "item_id": id, "output_index": index, "content_index": 0, "part": item["content"][0]}),
            );
        }
        event(json!({"type": "response.output_item.done", "output_index": index, "item": item}));
    }
    let mut done = responses_object(model, "completed", items, Some((input, output)));
    done["id"] = started["id"].clone();
    event(json!({"type": "response.completed", "response": done}));
    out
}
