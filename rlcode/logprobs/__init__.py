"""Log-probabilities of sampled completions under a causal LM: batched, with shared prompt prefixes
run once, and a head that never materialises the full [rows, tokens, vocab] logits."""
