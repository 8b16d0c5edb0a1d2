"""BabyAI as a text game: minigrid's BabyAI levels with a text renderer, high-level actions
and an expert built on minigrid's `BabyAIBot`."""
