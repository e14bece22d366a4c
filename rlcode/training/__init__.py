"""The training step's machinery shared by every mode: rollouts from the policy, the experience a
step learns from, the policy update, DDP agreement, exact resume and the step's record."""
