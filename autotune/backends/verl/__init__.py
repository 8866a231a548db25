"""verl (``verl.trainer.main_ppo``): everything autotune knows about it."""
