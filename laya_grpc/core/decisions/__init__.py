"""Decision semantics, upstream laya 0.4.15's to the letter: questions and their limits,
routing and language detection, per-request controls, temperatures, decoding and the
confidence gate. Pure Python and numpy, so the gateway decides without torch."""
