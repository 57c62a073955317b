// A coding agent of a user's own, in Node.js with nothing but its standard library: it asks a
// model (Anthropic Messages at $ANTHROPIC_BASE_URL, the sandbox's endpoint) what to do with one
// tool, `run`, which runs a shell command in the project, until the model answers in text.
//
// Usage: node fix_loop.mjs TASK

import { spawnSync } from "node:child_process";

const tools = [
  {
    name: "run",
    description: "Run a shell command in the project; returns its exit status and output.",
    input_schema: {
      type: "object",
      properties: { command: { type: "string" } },
      required: ["command"],
    },
  },
];

const messages = [{ role: "user", content: process.argv[2] }];
for (let turn = 0; turn < 10; turn++) {
  const response = await fetch(`${process.env.ANTHROPIC_BASE_URL}/v1/messages`, {
    method: "POST",
    headers: {
      "content-type": "application/json",
      "x-api-key": process.env.ANTHROPIC_API_KEY,
      "anthropic-version": "2023-06-01",
    },
    body: JSON.stringify({ model: "claude-sonnet-4-5", max_tokens: 1024, messages, tools }),
  });
  if (!response.ok) {
    console.error(`${response.status}: ${await response.text()}`);
    process.exit(1);
  }
  const reply = await response.json();
  messages.push({ role: "assistant", content: reply.content });
  const calls = reply.content.filter((block) => block.type === "tool_use");
  if (calls.length === 0) {
    console.log(reply.content.filter((block) => block.type === "text").map((b) => b.text).join(""));
    process.exit(0);
  }
  messages.push({
    role: "user",
    content: calls.map((call) => {
      const done = spawnSync("/bin/sh", ["-c", call.input.command], { encoding: "utf8" });
      return {
        type: "tool_result",
        tool_use_id: call.id,
        content: `exit ${done.status}\n${done.stdout}${done.stderr}`,
      };
    }),
  });
}
console.error("no answer after 10 turns");
process.exit(1);
