"""Many devices: replica shares, the global batch's gather, workers, what a strategy refuses."""
