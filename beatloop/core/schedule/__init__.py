"""The schedule's vocabulary as values: beats, groups, updates, phases, transforms, configs."""
