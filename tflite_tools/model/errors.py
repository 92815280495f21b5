"""The project's own error type for anything wrong with a model or a request about one."""


class ModelError(Exception):
    """A model cannot be read, written or processed; the message is one line a user can act on.

    Everything the tools reject on purpose raises this (or a subclass), so callers and the CLI
    can tell a bad input from a bug: the CLI prints the message and exits with code 2. Texts from
    LiteRT or a compiler that run over several lines are folded onto one.
    """

    def __init__(self, message: str = "") -> None:
        super().__init__(one_line(str(message)))


class ToolchainError(ModelError):
    """This machine cannot build what was asked: no C++ compiler, a compiler that fails, a full
    disk. Not the model's fault, but as much the user's to act on, so it is reported the same way."""


def one_line(text: str) -> str:
    """A message folded onto one line: LiteRT's and compilers' texts run over several, and the
    tools promise one line per error or warning."""
    return " ".join(text.split())
