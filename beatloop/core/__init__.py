"""The engine and its vocabulary: beats, schedules, recipes, callbacks, errors."""
