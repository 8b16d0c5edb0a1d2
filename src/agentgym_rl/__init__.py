"""agentgym-rl: train LLM agents for multi-turn decision making with reinforcement learning."""

__version__ = "0.1.0"
