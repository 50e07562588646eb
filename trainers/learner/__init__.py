"""The learner: GRPO on TRL with batches from LightningRL (packing, importance correction, multi-policy updates,
training across processes)."""
