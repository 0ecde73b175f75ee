"""An example beatloop plugin: the WGAN-GP recipe and an epoch-timer callback."""
