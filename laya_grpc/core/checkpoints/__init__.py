"""The checkpoint format: which checkpoints a deployment serves, opening and validating a
checkpoint directory, its JSON configs, the model's shape and the tensors it must hold."""
