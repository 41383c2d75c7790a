"""The command line: the commands and their exit codes (``main``), logging, ``node-check`` and ``check-federation``."""
