//! A scripted model server for the coding-agent tests: a real HTTP server on `127.0.0.1:0` that
//! speaks the three APIs today's agents use — OpenAI Chat Completions
//! (`POST /v1/chat/completions`), the OpenAI Responses API (`POST /v1/responses`) and Anthropic
//! Messages (`POST /v1/messages`, `POST /v1/messages/count_tokens`) — plus `GET /v1/models` in
//! either vendor's shape, whole or streamed as the vendors stream them (`wire`).
//!
//! It plays a [`ModelScript`]: each turn is either tool calls (the agent's own tool names, JSON
//! arguments) or a final text. A turn is served only when the request carries the results of
//! every call the previous turn made (by the ids this server gave them: `call_…`, `toolu_…`,
//! `fc_…`) and whatever the turn expects to see; anything else is answered with an error in the
//! API's own shape (`x-should-retry: false`) and recorded as a problem that names what arrived.
//! Every request is recorded.

pub mod agents;
pub mod script;
mod wire;

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use serde_json::json;

pub use crate::fake_models::Recorded;
pub use script::{Call, ModelScript, Reply, ToolResult, Turn};
use wire::{Answer, Api};

/// A call this server made, remembered to match its result.
#[derive(Debug, Clone)]
struct Issued {
    id: String,
    name: String,
}

#[derive(Default)]
struct Progress {
    /// Turns served so far.
    served: usize,
    /// The calls of the last turn served, awaiting their results.
    pending: Vec<Issued>,
    results: Vec<ToolResult>,
    problems: Vec<String>,
    recorded: Vec<Recorded>,
}

struct State {
    script: ModelScript,
    progress: Mutex<Progress>,
}

/// A running scripted model server (its own thread and runtime). Dropping it stops it.
pub struct ScriptedModels {
    /// `http://127.0.0.1:PORT` (no `/v1`).
    pub endpoint: String,
    state: Arc<State>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for ScriptedModels {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl ScriptedModels {
    /// Starts a server playing `script` on `127.0.0.1:0`, on its own thread.
    pub fn start(script: ModelScript) -> Self {
        let state = Arc::new(State {
            script,
            progress: Mutex::default(),
        });
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = state.clone();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let accept = async {
                    while let Ok((stream, _)) = listener.accept().await {
                        let _ = stream.set_nodelay(true);
                        serve_connection(stream, served.clone());
                    }
                };
                tokio::select! {
                    _ = accept => {}
                    _ = stopped => {}
                }
            });
        });
        Self {
            endpoint,
            state,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// `endpoint/v1`, for OpenAI clients' base URL.
    pub fn openai_base(&self) -> String {
        format!("{}/v1", self.endpoint)
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.state.progress.lock().unwrap().recorded.clone()
    }

    /// The tool results the agent sent back, in the order of the turns they let through.
    pub fn tool_results(&self) -> Vec<ToolResult> {
        self.state.progress.lock().unwrap().results.clone()
    }

    /// Turns served so far.
    pub fn turns_served(&self) -> usize {
        self.state.progress.lock().unwrap().served
    }

    /// Whether every turn of the script was served.
    pub fn finished(&self) -> bool {
        self.turns_served() == self.state.script.turns.len()
    }

    /// What went against the script, one line each (empty when all went to plan).
    pub fn problems(&self) -> Vec<String> {
        self.state.progress.lock().unwrap().problems.clone()
    }

    /// The model names the agent asked for, in order, one per model request.
    pub fn models_asked(&self) -> Vec<String> {
        self.requests()
            .iter()
            .filter(|r| Api::of_path(&r.path).is_some())
            .map(|r| r.json()["model"].as_str().unwrap_or_default().to_owned())
            .collect()
    }

    /// A summary of everything received and every problem, for a failing test's message.
    pub fn report(&self) -> String {
        let progress = self.state.progress.lock().unwrap();
        let mut out = format!(
            "scripted models: {} of {} turns served\n",
            progress.served,
            self.state.script.turns.len()
        );
        for request in &progress.recorded {
            out.push_str(&format!("  {}\n", summarize(request)));
        }
        for result in &progress.results {
            out.push_str(&format!(
                "  result of {} ({}): {:?}\n",
                result.name,
                result.call_id,
                clip(&result.output, 300)
            ));
        }
        for problem in &progress.problems {
            out.push_str(&format!("  PROBLEM: {problem}\n"));
        }
        out
    }
}

/// The first `n` characters of `text`.
fn clip(text: &str, n: usize) -> String {
    match text.char_indices().nth(n) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

/// One line about a request: method, path, model, stream, tools declared, messages.
fn summarize(request: &Recorded) -> String {
    let body = request.json();
    let Some(api) = Api::of_path(&request.path) else {
        return format!(
            "{} {} ({} bytes)",
            request.method,
            request.path,
            request.body.len()
        );
    };
    let tools: Vec<String> = wire::tool_names(api, &body);
    format!(
        "{} {} model={} stream={} tools=[{}] items={} last={:?}",
        request.method,
        request.path,
        body["model"].as_str().unwrap_or("?"),
        body["stream"].as_bool().unwrap_or(false),
        tools.join(","),
        wire::items(api, &body).len(),
        clip(&wire::last_text(api, &body), 200)
    )
}

/// Answers `request` from the script, recording what it should.
fn answer(state: &State, request: &Recorded) -> Answer {
    let body = request.json();
    let mut progress = state.progress.lock().unwrap();
    progress.recorded.push(request.clone());
    let anthropic_client = request.header("anthropic-version").is_some();
    match (request.method.as_str(), request.path.as_str()) {
        ("GET", "/v1/models") => {
            return Answer::json(wire::models(&state.script.models, anthropic_client))
        }
        ("POST", "/v1/messages/count_tokens") => {
            // Roughly four bytes a token, as the vendors' own estimates go.
            let tokens = request.body.len() / 4;
            return Answer::json(json!({ "input_tokens": tokens }));
        }
        _ => {}
    }
    let Some(api) = Api::of_path(&request.path).filter(|_| request.method == "POST") else {
        // Not an error of the script: agents probe what they may. Recorded, answered 404.
        return wire::error(
            None,
            404,
            &format!(
                "the scripted model server has no {} {}",
                request.method, request.path
            ),
        );
    };
    if body.is_null() {
        let problem = format!("{} with a body that is not JSON", request.path);
        progress.problems.push(problem.clone());
        return wire::error(Some(api), 400, &problem);
    }
    let model = body["model"].as_str().unwrap_or("scripted").to_owned();
    let tools = wire::tool_names(api, &body);
    if state.script.tools_required && tools.is_empty() {
        return wire::reply(
            api,
            &body,
            &model,
            &Reply::Text(state.script.side_reply.clone()),
            &[],
        );
    }
    let turn_index = progress.served;
    let Some(turn) = state.script.turns.get(turn_index) else {
        let problem = format!(
            "the script has {} turns, and another request arrived: {}",
            state.script.turns.len(),
            summarize(request)
        );
        progress.problems.push(problem.clone());
        return wire::error(Some(api), 400, &problem);
    };
    // The previous turn's calls must all have come back, by our ids.
    let results = wire::tool_results(api, &body);
    let mut missing = Vec::new();
    let mut fresh = String::new();
    // Kept only once the turn is served: a refused request's results are in its problem.
    let mut returned = Vec::new();
    for call in &progress.pending {
        match results.iter().find(|(id, _)| *id == call.id) {
            Some((_, output)) => {
                fresh.push_str(output);
                fresh.push('\n');
                returned.push(ToolResult {
                    call_id: call.id.clone(),
                    name: call.name.clone(),
                    output: output.clone(),
                });
            }
            None => missing.push(format!("{} ({})", call.name, call.id)),
        }
    }
    if !missing.is_empty() {
        let arrived: Vec<&String> = results.iter().map(|(id, _)| id).collect();
        let problem = format!(
            "turn {}: no tool result for {} (results arrived for {:?}); the request: {}",
            turn_index + 1,
            missing.join(", "),
            arrived,
            summarize(request)
        );
        progress.problems.push(problem.clone());
        return wire::error(Some(api), 400, &problem);
    }
    fresh.push_str(&wire::since_last_assistant(api, &body));
    let unseen: Vec<&String> = turn
        .expect
        .iter()
        .filter(|e| !fresh.contains(e.as_str()))
        .collect();
    if !unseen.is_empty() {
        let problem = format!(
            "turn {}: expected {:?} in what came back since the model's last turn, which was {:?}",
            turn_index + 1,
            unseen,
            clip(&fresh, 2000)
        );
        progress.problems.push(problem.clone());
        return wire::error(Some(api), 400, &problem);
    }
    if let Reply::Calls(calls) = &turn.reply {
        let unknown: Vec<&str> = calls
            .iter()
            .map(|c| c.name.as_str())
            .filter(|name| !tools.iter().any(|t| t == name))
            .collect();
        if !unknown.is_empty() {
            let problem = format!(
                "turn {}: the script calls {unknown:?}, which the agent did not declare (its tools: {tools:?})",
                turn_index + 1
            );
            progress.problems.push(problem.clone());
            return wire::error(Some(api), 400, &problem);
        }
    }
    let ids: Vec<wire::CallIds> = match &turn.reply {
        Reply::Calls(calls) => calls.iter().map(|_| wire::CallIds::new(api)).collect(),
        Reply::Text(_) => Vec::new(),
    };
    progress.pending = match &turn.reply {
        Reply::Calls(calls) => calls
            .iter()
            .zip(&ids)
            .map(|(call, ids)| Issued {
                id: ids.call_id.clone(),
                name: call.name.clone(),
            })
            .collect(),
        Reply::Text(_) => Vec::new(),
    };
    progress.results.extend(returned);
    progress.served += 1;
    wire::reply(api, &body, &model, &turn.reply, &ids)
}

/// Serves one connection: each request recorded and answered from the script.
fn serve_connection(stream: tokio::net::TcpStream, state: Arc<State>) {
    tokio::spawn(async move {
        let service = service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
            let state = state.clone();
            async move {
                let recorded = Recorded::read(request).await;
                let answer = answer(&state, &recorded);
                let mut response = hyper::Response::builder()
                    .status(answer.status)
                    .header("content-type", answer.content_type);
                if answer.status >= 400 {
                    response = response.header("x-should-retry", "false");
                }
                Ok::<_, Infallible>(response.body(Full::new(Bytes::from(answer.body))).unwrap())
            }
        });
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
            .await;
    });
}

#[cfg(test)]
mod tests {
    use std::io::{Read as _, Write as _};

    use serde_json::Value;

    use super::*;

    /// POSTs `body` to `path` (HTTP/1.1, connection closed after): (status, body).
    fn post(models: &ScriptedModels, path: &str, body: &Value) -> (u16, String) {
        let addr = models.endpoint.trim_start_matches("http://");
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        let body = body.to_string();
        write!(
            stream,
            "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut reply = String::new();
        stream.read_to_string(&mut reply).unwrap();
        let (head, body) = reply.split_once("\r\n\r\n").unwrap();
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        (status, body.to_owned())
    }

    /// The `data:` payloads of an SSE body (the chunked framing's size lines left out).
    fn events(body: &str) -> Vec<Value> {
        body.lines()
            .filter_map(|line| line.strip_prefix("data: "))
            .filter(|data| *data != "[DONE]")
            .map(|data| serde_json::from_str(data).unwrap())
            .collect()
    }

    fn script(tools_required: bool) -> ModelScript {
        ModelScript {
            turns: vec![
                Turn::calls(vec![Call::new("run", json!({"command": "ls"}))]),
                Turn::text("done").expecting("README.md"),
            ],
            tools_required,
            side_reply: "side".into(),
            models: vec!["m".into()],
        }
    }

    const CHAT_TOOLS: &str =
        r#"[{"type": "function", "function": {"name": "run", "parameters": {}}}]"#;

    #[test]
    fn chat_completions_wait_for_the_tool_result_and_say_what_arrived_instead() {
        let models = ScriptedModels::start(script(true));
        let tools: Value = serde_json::from_str(CHAT_TOOLS).unwrap();
        // A side call (no tools) does not advance the script.
        let (status, side) = post(
            &models,
            "/v1/chat/completions",
            &json!({"model": "m", "messages": [{"role": "user", "content": "title?"}]}),
        );
        assert_eq!(status, 200);
        assert_eq!(
            serde_json::from_str::<Value>(&side).unwrap()["choices"][0]["message"]["content"],
            "side"
        );
        let user = json!({"role": "user", "content": "list"});
        let (status, first) = post(
            &models,
            "/v1/chat/completions",
            &json!({"model": "m", "messages": [user], "tools": tools}),
        );
        assert_eq!(status, 200, "{first}");
        let first: Value = serde_json::from_str(&first).unwrap();
        assert_eq!(first["choices"][0]["finish_reason"], "tool_calls");
        let call = &first["choices"][0]["message"]["tool_calls"][0];
        let id = call["id"].as_str().unwrap();
        assert!(id.starts_with("call_") && id.len() == 29, "{id}");
        assert_eq!(call["function"]["arguments"], r#"{"command":"ls"}"#);
        // Without its result: refused, and the problem names what arrived.
        let (status, refused) = post(
            &models,
            "/v1/chat/completions",
            &json!({"model": "m", "messages": [user], "tools": tools}),
        );
        assert_eq!(status, 400, "{refused}");
        assert!(
            models.problems()[0].contains(&format!("no tool result for run ({id})")),
            "{:?}",
            models.problems()
        );
        // With it, streamed: the final text, in pieces.
        let messages = json!([user, first["choices"][0]["message"], {"role": "tool", "tool_call_id": id, "content": "README.md\nsrc\n"}]);
        let (status, stream) = post(
            &models,
            "/v1/chat/completions",
            &json!({"model": "m", "messages": messages, "tools": tools, "stream": true, "stream_options": {"include_usage": true}}),
        );
        assert_eq!(status, 200, "{stream}");
        let chunks = events(&stream);
        let text: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(text, "done");
        assert!(
            chunks.last().unwrap()["usage"]["prompt_tokens"]
                .as_u64()
                .unwrap()
                > 0
        );
        assert!(models.finished());
        assert_eq!(models.tool_results()[0].output, "README.md\nsrc\n");
    }

    #[test]
    fn anthropic_messages_stream_tool_use_as_input_json_deltas() {
        let models = ScriptedModels::start(script(true));
        let tools = json!([{"name": "run", "input_schema": {"type": "object"}}]);
        let user = json!({"role": "user", "content": "list"});
        let (status, stream) = post(
            &models,
            "/v1/messages",
            &json!({"model": "m", "max_tokens": 9, "messages": [user], "tools": tools, "stream": true}),
        );
        assert_eq!(status, 200, "{stream}");
        let events = events(&stream);
        let start = events
            .iter()
            .find(|e| e["type"] == "content_block_start")
            .unwrap();
        let id = start["content_block"]["id"].as_str().unwrap().to_owned();
        assert!(id.starts_with("toolu_01"), "{id}");
        let input: String = events
            .iter()
            .filter_map(|e| e["delta"]["partial_json"].as_str())
            .collect();
        assert_eq!(
            serde_json::from_str::<Value>(&input).unwrap(),
            json!({"command": "ls"})
        );
        let stop = events
            .iter()
            .find(|e| e["type"] == "message_delta")
            .unwrap();
        assert_eq!(stop["delta"]["stop_reason"], "tool_use");
        // The result as a user message's tool_result block; the reply whole.
        let messages = json!([user, {"role": "assistant", "content": [{"type": "tool_use", "id": id, "name": "run", "input": {"command": "ls"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": [{"type": "text", "text": "README.md"}]}]}]);
        let (status, whole) = post(
            &models,
            "/v1/messages",
            &json!({"model": "m", "max_tokens": 9, "messages": messages, "tools": tools}),
        );
        assert_eq!(status, 200, "{whole}");
        let whole: Value = serde_json::from_str(&whole).unwrap();
        assert_eq!(
            (
                whole["content"][0]["text"].as_str(),
                whole["stop_reason"].as_str()
            ),
            (Some("done"), Some("end_turn"))
        );
        assert!(models.problems().is_empty(), "{}", models.report());
    }

    #[test]
    fn responses_stream_function_calls_and_take_their_outputs() {
        let models = ScriptedModels::start(script(true));
        let tools = json!([{"type": "function", "name": "run", "parameters": {}}]);
        let input = json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list"}]});
        let (status, stream) = post(
            &models,
            "/v1/responses",
            &json!({"model": "m", "input": [input], "tools": tools, "stream": true, "store": false}),
        );
        assert_eq!(status, 200, "{stream}");
        let events = events(&stream);
        let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(kinds.first(), Some(&"response.created"));
        assert_eq!(kinds.last(), Some(&"response.completed"));
        let item = &events
            .iter()
            .find(|e| e["type"] == "response.output_item.done")
            .unwrap()["item"];
        assert!(item["id"].as_str().unwrap().starts_with("fc_"), "{item}");
        let arguments: String = events
            .iter()
            .filter(|e| e["type"] == "response.function_call_arguments.delta")
            .map(|e| e["delta"].as_str().unwrap())
            .collect();
        assert_eq!(arguments, item["arguments"].as_str().unwrap());
        // The output, not streamed; an expectation unmet is refused, naming what came back.
        let output = |text: &str| json!({"model": "m", "tools": tools, "input": [input, item, {"type": "function_call_output", "call_id": item["call_id"], "output": text}]});
        let (status, _) = post(&models, "/v1/responses", &output("nothing here"));
        assert_eq!(status, 400);
        assert!(
            models.problems()[0].contains("nothing here"),
            "{:?}",
            models.problems()
        );
        // The same turn, once the output carries what it expects.
        let (status, whole) = post(&models, "/v1/responses", &output("README.md"));
        assert_eq!(status, 200, "{whole}");
        let whole: Value = serde_json::from_str(&whole).unwrap();
        assert_eq!(whole["output"][0]["content"][0]["text"], "done");
        assert!(models.finished());
        assert_eq!(models.tool_results()[0].output, "README.md");
    }
}
