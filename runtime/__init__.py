"""solm runtime: TinyLM, the slot-addressed paged KV store, tokenizer, engines, tasks, training."""
