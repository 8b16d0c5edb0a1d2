"""The agent layer: chat encoding, generators, model loading and the tiny offline model."""
