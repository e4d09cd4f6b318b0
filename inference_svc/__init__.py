"""inference_svc."""
