"""The shared core: errors, questions, decoding, routing, checkpoint files, flags and the
internal-call machinery. It imports no service (a test enforces it) and never imports torch or mlx."""
