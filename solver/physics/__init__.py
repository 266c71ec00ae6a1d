"""Physics models of a training step, each composed of the topic modules' formula functions."""
