//! A real llama.cpp server for the local-route tests: `llama-server` as scripts/test builds it
//! (`TOLLGATE_LLAMA_SERVER`), serving a tiny model with random weights written at test time
//! by `tests/python/tiny_gguf.py` (the reference GGUF writer; nothing is downloaded).

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The model name the server answers to (`--alias`).
pub const MODEL: &str = "tiny";

/// The chat template of [`LlamaServer::start_with_tools`]: Llama 3's layout (tool results in
/// `ipython` turns, calls as JSON objects), short enough for the tiny model's 512 tokens.
pub const TOOLS_TEMPLATE: &str = r#"{%- for message in messages %}
{%- if message.role == "ipython" or message.role == "tool" %}<|start_header_id|>ipython<|end_header_id|>

{{ message.content }}<|eot_id|>
{%- elif message.tool_calls %}<|start_header_id|>assistant<|end_header_id|>

{%- for tool_call in message.tool_calls %}{"name": "{{ tool_call.function.name }}", "parameters": {{ tool_call.function.arguments | tojson }}}{% endfor %}<|eot_id|>
{%- else %}<|start_header_id|>{{ message.role }}<|end_header_id|>

{% if tools and loop.first %}{{ tools | tojson }}
{% endif %}{{ message.content }}<|eot_id|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}"#;

/// A running `llama-server`; killed when dropped.
#[derive(Debug)]
pub struct LlamaServer {
    child: Child,
    /// `127.0.0.1:<port>`.
    pub addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl LlamaServer {
    /// Writes the tiny model and starts the server on a free loopback port, waiting until
    /// `/health` answers 200. `None` when `TOLLGATE_SKIP_LLAMA_TESTS` is set; without it a
    /// missing server is a failure that says how to get one.
    pub fn start() -> Option<Self> {
        Self::start_as(false)
    }

    /// As [`Self::start`], for tool calls: the model's tokenizer adds no space prefix and the
    /// server renders chats with [`TOOLS_TEMPLATE`] (`--jinja`), a Llama 3 style template
    /// llama.cpp recognises, so a request with tools gets the server's tool-call grammar and
    /// parser. The model's weights are random: a reply may or may not end in a tool call.
    pub fn start_with_tools() -> Option<Self> {
        Self::start_as(true)
    }

    fn start_as(tools: bool) -> Option<Self> {
        if std::env::var_os("TOLLGATE_SKIP_LLAMA_TESTS").is_some() {
            return None;
        }
        let binary = std::env::var_os("TOLLGATE_LLAMA_SERVER")
            .map(PathBuf::from)
            .filter(|path| path.is_file())
            .expect("no llama-server: run scripts/test (it builds one), or set TOLLGATE_SKIP_LLAMA_TESTS=1");
        let dir = tempfile::tempdir().expect("tempdir");
        let model = dir.path().join("tiny.gguf");
        let python = std::env::var("TOLLGATE_PYTHON").unwrap_or_else(|_| "python3".into());
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("python/tiny_gguf.py");
        let written = Command::new(python)
            .arg(&script)
            .arg(&model)
            .args(tools.then_some("--tools"))
            .output()
            .expect("run tiny_gguf.py");
        assert!(written.status.success(), "tiny_gguf.py: {written:?}");
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut command = Command::new(binary);
        if tools {
            let template = dir.path().join("tools.jinja");
            std::fs::write(&template, TOOLS_TEMPLATE).expect("write the chat template");
            command
                .arg("--jinja")
                .arg("--chat-template-file")
                .arg(template);
        }
        let child = command
            .arg("-m")
            .arg(&model)
            .args(["--alias", MODEL, "--host", "127.0.0.1", "--port"])
            .arg(port.to_string())
            .args(["-c", "512", "-t", "1", "--parallel", "1"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn llama-server");
        let server = Self {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while server.get("/health").0 != 200 {
            assert!(
                Instant::now() < deadline,
                "llama-server did not become healthy"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(server)
    }

    /// `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn request(&self, head: &str, body: &str) -> (u16, String) {
        let Ok(mut stream) = TcpStream::connect(self.addr) else {
            return (0, String::new());
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
        let request = format!(
            "{head} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.addr,
            body.len()
        );
        if stream.write_all(request.as_bytes()).is_err() {
            return (0, String::new());
        }
        let mut reply = String::new();
        let _ = stream.read_to_string(&mut reply);
        let status = reply
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let body = reply
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        (status, body)
    }

    fn get(&self, path: &str) -> (u16, String) {
        self.request(&format!("GET {path}"), "")
    }

    /// The prompt tokens the server itself reports for one user message (its own chat
    /// template and tokenizer), from a one-token completion.
    pub fn prompt_tokens(&self, text: &str) -> u64 {
        let body = serde_json::json!({
            "model": MODEL,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": 1,
        })
        .to_string();
        let (status, reply) = self.request("POST /v1/chat/completions", &body);
        assert_eq!(status, 200, "{reply}");
        let reply: serde_json::Value = serde_json::from_str(&reply).expect("JSON reply");
        reply["usage"]["prompt_tokens"]
            .as_u64()
            .expect("usage.prompt_tokens")
    }
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
