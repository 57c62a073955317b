use super::*;
use pb::content_part::Part;

#[test]
fn input_items_become_one_assistant_turn_and_tool_messages() {
    let body = json!({
        "model": "gpt-5-codex",
        "instructions": "You are Codex.",
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "sandbox rules"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix it"}, {"type": "input_image", "image_url": "data:image/png;base64,aGk="}]},
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "plan"}], "encrypted_content": "enc"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Running."}]},
            {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "shell", "arguments": "{\"command\":[\"ls\"]}"},
            {"type": "custom_tool_call", "call_id": "call_2", "name": "apply_patch", "input": "*** Begin Patch"},
            {"type": "function_call_output", "call_id": "call_1", "output": "a.txt"},
            {"type": "custom_tool_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "done"}]},
            {"type": "web_search_call", "id": "ws_1", "status": "completed"},
        ],
        "tools": [
            {"type": "function", "name": "shell", "description": "runs", "parameters": {"type": "object"}, "strict": false},
            {"type": "custom", "name": "apply_patch", "description": "patches", "format": {"type": "grammar", "syntax": "lark", "definition": "start: x"}},
            {"type": "web_search"},
            {"type": "local_shell"},
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": false,
        "reasoning": {"effort": "high", "summary": "auto"},
        "text": {"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}, "strict": true}},
        "max_output_tokens": 100,
        "store": false,
        "include": ["reasoning.encrypted_content"],
        "stream": true,
    });
    let call = parse(&body).unwrap();
    let r = &call.request;
    assert_eq!(
        call.dropped,
        vec!["web_search".to_owned(), "local_shell".to_owned()]
    );
    assert_eq!(call.custom_tools, vec!["apply_patch".to_owned()]);
    let roles: Vec<&str> = r.messages.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(
        roles,
        ["system", "developer", "user", "assistant", "tool", "tool"]
    );
    assert_eq!(r.messages[0].content, "You are Codex.");
    assert!(matches!(&r.messages[2].parts[0].part, Some(Part::Image(_))));
    let turn = &r.messages[3].parts;
    assert!(
        matches!(&turn[0].part, Some(Part::Thinking(t)) if t.text == "plan" && t.signature == "enc" && t.origin == "openai-responses" && t.id == "rs_1")
    );
    assert!(matches!(&turn[1].part, Some(Part::Text(t)) if t == "Running."));
    assert!(
        matches!(&turn[2].part, Some(Part::ToolCall(c)) if c.id == "call_1" && c.name == "shell")
    );
    assert!(
        matches!(&turn[3].part, Some(Part::ToolCall(c)) if c.arguments_json == r#"{"input":"*** Begin Patch"}"#)
    );
    assert!(
        matches!(&r.messages[5].parts[0].part, Some(Part::ToolResult(t)) if t.call_id == "call_2")
    );
    assert_eq!(r.tools.len(), 2);
    assert!(r.tools[1].description.contains("start: x"));
    assert!(r.tools[1].parameters_json.contains("\"input\""));
    let reasoning = r.reasoning.as_ref().unwrap();
    assert_eq!(
        (reasoning.effort.as_str(), reasoning.summary),
        ("high", true)
    );
    let format: Value = serde_json::from_str(&r.response_format_json).unwrap();
    assert_eq!(format["json_schema"]["name"], "out");
    assert_eq!((r.max_tokens, r.stream), (100, true));
    assert_eq!(r.tool_choice.as_ref().unwrap().parallel, Some(false));
}

#[test]
fn stored_responses_are_refused_in_one_line() {
    let body = json!({"input": "hi", "previous_response_id": "resp_1"});
    assert!(parse(&body).unwrap_err().0.contains("send the whole input"));
    let body = json!({"input": [{"type": "item_reference", "id": "x"}]});
    assert!(parse(&body).is_err());
    let call = parse(&json!({"input": "hi", "tools": []})).unwrap();
    assert_eq!(call.request.messages[0].content, "hi");
}

fn context() -> Context {
    Context {
        started: pb::CompleteStarted {
            call_id: "c-1".into(),
            route: "cloud".into(),
            model: "gpt-5".into(),
            ..Default::default()
        },
        created: 7,
        include_usage: false,
        custom_tools: vec!["apply_patch".into()],
    }
}

fn events(text: &str) -> Vec<Value> {
    text.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let (name, data) = e.split_once('\n').unwrap();
            let data: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
            assert_eq!(name.strip_prefix("event: ").unwrap(), data["type"]);
            data
        })
        .collect()
}

fn call(index: u32, id: &str, name: &str, arguments: &str) -> pb::CompleteDelta {
    pb::CompleteDelta {
        tool_call: Some(pb::ToolCallDelta {
            index,
            id: id.into(),
            name: name.into(),
            arguments: arguments.into(),
        }),
        ..Default::default()
    }
}

#[test]
fn streams_announce_and_finish_every_item_in_sequence() {
    let mut s = ResponsesStream::new(context());
    let mut out = s.start();
    out += &s.delta(&pb::CompleteDelta {
        thinking: Some(pb::ThinkingDelta {
            text: "plan".into(),
            ..Default::default()
        }),
        ..Default::default()
    });
    out += &s.delta(&pb::CompleteDelta {
        text: "Hel".into(),
        ..Default::default()
    });
    out += &s.delta(&pb::CompleteDelta {
        text: "lo".into(),
        ..Default::default()
    });
    out += &s.delta(&call(0, "call_1", "shell", "{\"command\""));
    out += &s.delta(&call(0, "", "", ":[\"ls\"]}"));
    out += &s.delta(&call(1, "call_2", "apply_patch", "{\"input\":\"*** Begin"));
    out += &s.delta(&call(1, "", "", " Patch\"}"));
    out += &s.done(&pb::CompleteDone {
        finish_reason: "tool_calls".into(),
        prompt: Some(pb::TokenCount {
            tokens: 10,
            source: 1,
        }),
        completion: Some(pb::TokenCount {
            tokens: 4,
            source: 1,
        }),
        ..Default::default()
    });
    let e = events(&out);
    let kinds: Vec<&str> = e.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.reasoning_summary_part.added",
            "response.reasoning_summary_text.delta",
            "response.reasoning_summary_text.done",
            "response.reasoning_summary_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.custom_tool_call_input.delta",
            "response.custom_tool_call_input.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    for (n, event) in e.iter().enumerate() {
        assert_eq!(event["sequence_number"], n);
    }
    assert_eq!(e[0]["response"]["status"], "in_progress");
    assert!(e[0]["response"]["id"]
        .as_str()
        .unwrap()
        .starts_with("resp_"));
    assert_eq!(e[7]["item"]["type"], "reasoning");
    assert_eq!(e[7]["item"]["summary"][0]["text"], "plan");
    assert_eq!(e[12]["text"], "Hello");
    assert_eq!(
        e[14]["item"]["content"][0],
        json!({"type": "output_text", "text": "Hello", "annotations": [], "logprobs": []})
    );
    assert_eq!(e[15]["output_index"], 2);
    assert_eq!(e[19]["item"]["type"], "function_call");
    assert_eq!(e[19]["item"]["call_id"], "call_1");
    assert_eq!(e[19]["item"]["arguments"], "{\"command\":[\"ls\"]}");
    assert!(e[19]["item"]["id"].as_str().unwrap().starts_with("fc_"));
    assert_eq!(e[21]["delta"], "*** Begin Patch");
    assert_eq!(
        e[23]["item"],
        json!({"id": e[23]["item"]["id"], "type": "custom_tool_call", "status": "completed", "call_id": "call_2", "name": "apply_patch", "input": "*** Begin Patch"})
    );
    let done = &e[24]["response"];
    assert_eq!(done["status"], "completed");
    assert_eq!(done["model"], "gpt-5");
    assert_eq!(done["output"].as_array().unwrap().len(), 4);
    assert_eq!(done["usage"]["total_tokens"], 14);
    assert_eq!(done["usage"]["input_tokens_details"]["cached_tokens"], 0);
}

#[test]
fn a_cut_off_reply_is_incomplete_and_a_failure_is_failed() {
    let mut s = ResponsesStream::new(context());
    s.start();
    let out = s.done(&pb::CompleteDone {
        finish_reason: "length".into(),
        ..Default::default()
    });
    let e = events(&out);
    assert_eq!(e[0]["type"], "response.incomplete");
    assert_eq!(
        e[0]["response"]["incomplete_details"]["reason"],
        "max_output_tokens"
    );
    let mut s = ResponsesStream::new(context());
    s.start();
    let e = events(&s.error(&tonic::Status::resource_exhausted("budget spent")));
    assert_eq!(e[0]["type"], "response.failed");
    assert_eq!(
        e[0]["response"]["error"],
        json!({"code": "insufficient_quota", "message": "budget spent"})
    );
}

#[test]
fn whole_replies_list_output_items() {
    let mut r = Reply::default();
    r.push(&pb::CompleteDelta {
        text: "ok".into(),
        ..Default::default()
    });
    r.push(&call(0, "call_1", "shell", "{}"));
    r.done.finish_reason = "tool_calls".into();
    let body = reply(&context(), &r);
    assert_eq!(body["object"], "response");
    assert_eq!(body["status"], "completed");
    assert_eq!(body["output"][0]["content"][0]["text"], "ok");
    assert_eq!(body["output"][1]["type"], "function_call");
    assert_eq!(body["output"][1]["call_id"], "call_1");
}

#[test]
fn anthropic_reasoning_goes_back_to_anthropic() {
    let mut r = Reply::default();
    r.push(&pb::CompleteDelta {
        thinking: Some(pb::ThinkingDelta {
            text: "plan".into(),
            signature: "sig".into(),
            origin: "anthropic".into(),
            ..Default::default()
        }),
        ..Default::default()
    });
    let item = reply(&context(), &r)["output"][0].clone();
    assert_eq!(item["encrypted_content"], "sig");
    let call =
        parse(&json!({"input": [item, {"type": "message", "role": "user", "content": "go on"}]}))
            .unwrap();
    let Some(Part::Thinking(t)) = &call.request.messages[0].parts[0].part else {
        panic!("{:?}", call.request.messages)
    };
    assert_eq!(
        (
            t.origin.as_str(),
            t.signature.as_str(),
            t.text.as_str(),
            t.id.as_str()
        ),
        ("anthropic", "sig", "plan", "")
    );
    let native = parse(&json!({"input": [{"type": "reasoning", "id": "rs_9", "summary": [], "encrypted_content": "e"}]})).unwrap();
    let Some(Part::Thinking(t)) = &native.request.messages[0].parts[0].part else {
        panic!()
    };
    assert_eq!(
        (t.origin.as_str(), t.id.as_str()),
        ("openai-responses", "rs_9")
    );
}
