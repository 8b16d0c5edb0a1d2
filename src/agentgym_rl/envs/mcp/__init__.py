"""Tools from an MCP server as an environment (`env.id: mcp`)."""
