"""Between compiled calls: callbacks, their events and order, what they see of the run."""
