"""The web environment: WebArena's observations and actions in a real headless Chromium, on
websites this package serves itself (`env.py`)."""
