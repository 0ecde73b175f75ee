"""What a run keeps on disk: its run dir and lock, run.json, and its checkpoints."""
