"""TRL's GRPOTrainer: everything autotune knows about it."""
