"""The command line's commands: each module parses nothing, it runs one command
from the arguments :mod:`headroom.cli` parsed.
"""
