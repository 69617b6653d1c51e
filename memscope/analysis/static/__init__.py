"""Static (config-only) memory estimation for Megatron GPT training, per rank."""
