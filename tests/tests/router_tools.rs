//! Tool calls through a real llama.cpp server (`llama-server --jinja`) behind a local route:
//! the request the router builds from a canonical call is one the server takes (tools,
//! tool choice, an earlier call and its result), its reply, whole and streamed, comes back
//! as a parsed tool call, and the server's tokenizer counts the tools as the call sends them.

use tokio::sync::mpsc;
use tollgate_proto::v1 as pb;
use tollgate_router::config::Routes;
use tollgate_router::wire::{ChatRequest, StreamItem};
use tollgate_router_backends::Backends;
use tollgate_tests::llama::{LlamaServer, MODEL};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn routes(server: &LlamaServer) -> Routes {
    Routes::parse(
        &format!(
            "[[route]]\nname = \"local\"\nkind = \"local\"\npreset = \"llamacpp\"\nendpoint = \"{}\"\nmodel = \"{MODEL}\"\n",
            server.endpoint()
        ),
        "routes.toml",
    )
    .unwrap()
}

fn text(role: &str, content: &str) -> pb::ChatMessage {
    pb::ChatMessage {
        role: role.into(),
        content: content.into(),
        parts: Vec::new(),
    }
}

/// A call that must use the one tool, `get_time` (no parameters).
fn tool_call_request(stream: bool, messages: Vec<pb::ChatMessage>) -> ChatRequest {
    ChatRequest {
        model: MODEL.into(),
        call: pb::CompleteRequest {
            messages,
            max_tokens: 256,
            stream,
            // Random weights: sampling, not the greedy loop, reaches the call.
            temperature: Some(1.0),
            tools: vec![pb::ToolDefinition {
                name: "get_time".into(),
                description: "The time now".into(),
                parameters_json:
                    r#"{"type":"object","properties":{},"additionalProperties":false}"#.into(),
                ..Default::default()
            }],
            tool_choice: Some(pb::ToolChoice {
                mode: pb::tool_choice::Mode::Required as i32,
                name: String::new(),
                // One call at a time (`parallel_tool_calls: false`).
                parallel: Some(false),
            }),
            ..Default::default()
        },
    }
}

/// What one reply said: its tool calls (id, name, arguments), finish reason, prompt tokens.
#[derive(Debug, Default)]
struct Reply {
    calls: Vec<(String, String, String)>,
    finish: String,
    prompt: Option<u64>,
}

async fn send(backends: &Backends, routes: &Routes, chat: &ChatRequest) -> Reply {
    let (tx, mut rx) = mpsc::channel(1024);
    let route = routes.get("local").unwrap();
    let collect = async {
        let mut reply = Reply::default();
        while let Some(item) = rx.recv().await {
            match item {
                StreamItem::Delta(delta) => {
                    if let Some(piece) = delta.tool_call {
                        let index = piece.index as usize;
                        if reply.calls.len() <= index {
                            reply.calls.resize(index + 1, Default::default());
                        }
                        let call = &mut reply.calls[index];
                        call.0.push_str(&piece.id);
                        call.1.push_str(&piece.name);
                        call.2.push_str(&piece.arguments);
                    }
                }
                StreamItem::Finish(reason) => reply.finish = reason,
                StreamItem::Usage { prompt, .. } => reply.prompt = prompt.or(reply.prompt),
                StreamItem::Done => {}
            }
        }
        reply
    };
    let (result, reply) = tokio::join!(
        async move {
            let result = backends.call(route, chat, &tx).await;
            drop(tx);
            result
        },
        collect
    );
    result.expect("the server takes the request");
    reply
}

/// Sends `chat` until the model makes a call (random weights: most tries do within a few),
/// then checks it.
async fn until_a_call(backends: &Backends, routes: &Routes, chat: &ChatRequest) -> Reply {
    for _ in 0..40 {
        let reply = send(backends, routes, chat).await;
        if reply.finish == "tool_calls" {
            assert_eq!(reply.calls.len(), 1, "{reply:?}");
            let (id, name, arguments) = &reply.calls[0];
            assert!(!id.is_empty(), "{reply:?}");
            assert_eq!(name, "get_time");
            let arguments: serde_json::Value = serde_json::from_str(arguments).unwrap();
            assert_eq!(arguments, serde_json::json!({}));
            return reply;
        }
        assert_eq!(reply.finish, "length", "{reply:?}");
    }
    panic!("no tool call in 40 tries");
}

#[test]
fn llama_cpp_makes_tool_calls_through_the_router_whole_and_streamed() {
    let Some(server) = LlamaServer::start_with_tools() else {
        return;
    };
    let routes = routes(&server);
    let backends = Backends::new(&routes).unwrap();
    let route = routes.get("local").unwrap();
    runtime().block_on(async {
        let ask = vec![text("user", "what time is it")];
        for stream in [false, true] {
            let chat = tool_call_request(stream, ask.clone());
            let reply = until_a_call(&backends, &routes, &chat).await;
            // The server's tokenizer counts the prompt as the call sent it, tools included.
            let counted = backends.count_prompt(route, &chat).await.unwrap();
            assert_eq!(Some(counted), reply.prompt, "stream: {stream}");
        }
        let without_tools = ChatRequest {
            model: MODEL.into(),
            call: pb::CompleteRequest {
                messages: ask.clone(),
                ..Default::default()
            },
        };
        let bare = backends.count_prompt(route, &without_tools).await.unwrap();
        let with_tools = backends
            .count_prompt(route, &tool_call_request(false, ask))
            .await
            .unwrap();
        assert!(with_tools > bare + 20, "{with_tools} vs {bare}");
    });
}

#[test]
fn an_anthropic_agents_tool_history_is_taken_by_llama_cpp() {
    use pb::content_part::Part;
    let Some(server) = LlamaServer::start_with_tools() else {
        return;
    };
    let routes = routes(&server);
    let backends = Backends::new(&routes).unwrap();
    let route = routes.get("local").unwrap();
    // As an Anthropic agent sends it: the assistant's tool_use, then a user turn with its
    // tool_result.
    let part = |part: Part| pb::ContentPart {
        part: Some(part),
        cache: false,
    };
    let history = vec![
        text("user", "what time is it"),
        pb::ChatMessage {
            role: "assistant".into(),
            content: String::new(),
            parts: vec![part(Part::ToolCall(pb::ToolCall {
                id: "toolu_01A09q90qw90lq917835lq9".into(),
                name: "get_time".into(),
                arguments_json: "{}".into(),
            }))],
        },
        pb::ChatMessage {
            role: "user".into(),
            content: String::new(),
            parts: vec![part(Part::ToolResult(pb::ToolResult {
                call_id: "toolu_01A09q90qw90lq917835lq9".into(),
                content: vec![part(Part::Text("12:00 UTC".into()))],
                is_error: false,
            }))],
        },
    ];
    runtime().block_on(async {
        let mut chat = tool_call_request(false, history.clone());
        // The tiny model's context is short: the reply need not reach a call here.
        chat.call.max_tokens = 32;
        // The server takes the history, and renders the result into the prompt: counting it
        // and sending it agree.
        let reply = send(&backends, &routes, &chat).await;
        let counted = backends.count_prompt(route, &chat).await.unwrap();
        assert_eq!(Some(counted), reply.prompt, "{reply:?}");
        let first_turn = backends
            .count_prompt(route, &tool_call_request(false, history[..1].to_vec()))
            .await
            .unwrap();
        assert!(counted > first_turn + 9, "{counted} vs {first_turn}");
    });
}
