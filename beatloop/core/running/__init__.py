"""The run: the recipe base class, its parts assembled, the engine's epochs, recovery."""
