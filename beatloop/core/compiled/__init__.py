"""A schedule made into TensorFlow: bound and checked, traced into the step and K-step loop."""
