"""bl-distill: a beatloop plugin written from beatloop 0.1.0's docs (a test fixture)."""
