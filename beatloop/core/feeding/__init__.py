"""The data's path into the compiled loop: passes, their position, iterators, worker shards."""
