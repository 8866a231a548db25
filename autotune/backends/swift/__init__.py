"""ms-swift (``swift rlhf --rlhf_type grpo``): everything autotune knows about it."""
