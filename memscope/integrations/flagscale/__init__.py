"""FlagScale adapters: the auto-tuner's memory model and trial-memory reader."""
