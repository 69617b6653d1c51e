"""Event schema, the bounded in-memory recorder and the JSONL trace sink."""
