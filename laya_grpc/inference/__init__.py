"""The inference service: loads checkpoints, batches token rows fairly and runs the network
(torch on CUDA, MPS or CPU; MLX on Apple Silicon)."""
