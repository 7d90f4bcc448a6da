"""Text in and out: the tokenizer and chat template (`tokenizer`, `chat_template`), streaming
detokenization and stop strings (`detokenize`), and sampling (`sampling`, over the highest logits
that `top_logits` takes where the logits are)."""
