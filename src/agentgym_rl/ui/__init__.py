"""The web viewer of runs (`agentgym-rl view`) and the static run report (`agentgym-rl report`)."""
