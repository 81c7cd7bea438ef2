"""The one error users see, and its exit code: the bottom of ptrun, imported by everything that checks input."""


class ConfigError(ValueError):
    """A user-facing configuration problem; its message is one line naming the key and what is allowed."""


EXIT_BAD_INPUT = 2
"""The exit code for bad input: `ptrun` itself, and a worker that found it (a checkpoint of another model, a
broken dataset file) after writing its one-line message into the launch's errors directory."""
