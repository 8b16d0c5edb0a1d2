"""HTTP servers of the project's environments (`agentgym-rl serve-env`); the client is
`agentgym_rl.envs.remote.HttpEnv`."""
