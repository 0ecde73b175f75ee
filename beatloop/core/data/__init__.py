"""What data is to the engine: dict batches and their checks, loop data, sources, environments."""
