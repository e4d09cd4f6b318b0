"""The shared core, by concern: `decisions` (upstream laya's decision semantics), `checkpoints`
(the checkpoint format), `wire` (how the processes talk), `runtime` (what every service process
runs on), and `errors`, the one error type. It imports no service (a test enforces it) and never
imports torch or mlx."""
