"""tokenizer_svc."""
