"""Top layer: RL algorithms (one file each), the CLI and the iteration loop."""
