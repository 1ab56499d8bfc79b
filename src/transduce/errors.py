"""Errors that are the user's to fix: the CLI prints them as one line and exits with code 2."""


class UserError(Exception):
    """Bad input (a config key, a file, an option value). The message names what is wrong."""
