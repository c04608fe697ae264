"""The harness: CLI, run orchestration, configuration, results store and leaderboard."""

__version__ = "0.1.0"
