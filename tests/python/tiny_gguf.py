"""Writes a tiny llama-architecture GGUF model with random weights: no download, a few
hundred KiB, enough for a real llama.cpp server to load, tokenize and stream (nonsense).

Usage: tiny_gguf.py OUT.gguf [--tools]

--tools: the tokenizer adds no space before the text (SentencePiece's add_space_prefix off).
llama.cpp checks a tool-call grammar against the tokens of the chat template's generation
prompt; with the space prefix those tokens begin with a space the grammar does not expect,
and the server refuses every request that has tools.
"""

import sys

import gguf
import numpy as np


def main() -> None:
    out = sys.argv[1]
    tools = "--tools" in sys.argv[2:]
    rng = np.random.default_rng(7)
    n_embd, n_ff, n_head, n_layer, n_ctx = 64, 128, 4, 1, 512
    # A SentencePiece-style vocabulary: specials, the 256 byte tokens (every text encodes),
    # and a few words so that tokenizing ordinary text is not all bytes.
    words = ["▁the", "▁a", "▁is", "▁hello", "▁world", "▁model", "▁to", "▁of", "▁and", "▁in"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)] + words
    types = (
        [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
        + [gguf.TokenType.BYTE] * 256
        + [gguf.TokenType.NORMAL] * len(words)
    )
    scores = [0.0] * 259 + [-float(i) for i in range(len(words))]
    n_vocab = len(tokens)

    w = gguf.GGUFWriter(out, "llama")
    w.add_name("tollgate-tiny-test-model")
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head)
    w.add_rope_dimension_count(n_embd // n_head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    if tools:
        w.add_add_space_prefix(False)
    w.add_chat_template(
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}<|assistant|>"
    )

    def tensor(name, *shape):
        w.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))

    def ones(name, n):
        w.add_tensor(name, np.ones(n, dtype=np.float32))

    # numpy shapes are ggml's dimensions reversed.
    tensor("token_embd.weight", n_vocab, n_embd)
    ones("output_norm.weight", n_embd)
    tensor("output.weight", n_vocab, n_embd)
    for i in range(n_layer):
        ones(f"blk.{i}.attn_norm.weight", n_embd)
        for part in ("q", "k", "v", "output"):
            tensor(f"blk.{i}.attn_{part}.weight", n_embd, n_embd)
        ones(f"blk.{i}.ffn_norm.weight", n_embd)
        tensor(f"blk.{i}.ffn_gate.weight", n_ff, n_embd)
        tensor(f"blk.{i}.ffn_up.weight", n_ff, n_embd)
        tensor(f"blk.{i}.ffn_down.weight", n_embd, n_ff)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
